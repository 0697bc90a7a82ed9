"""Mixtral: LLaMA with a mixture of experts (softmax routing, the top-k weights renormalized).
llama.cpp's converter writes these files with general.architecture "llama" and expert_count."""

from __future__ import annotations

import dataclasses
from typing import Any

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    md["llama.expert_count"] = cfg.num_local_experts
    md["llama.expert_used_count"] = cfg.num_experts_per_tok
    return md


# top-2 of 4 experts (each n_ff wide: Mixtral has no expert_feed_forward_length)
hf_tiny.register(
    Family(
        "mixtral",
        "llama",
        "MixtralConfig",
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
        metadata_fn=_metadata,
    )
)
