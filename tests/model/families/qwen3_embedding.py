"""Qwen3-Embedding and Qwen3-Reranker: plain ``qwen3`` files that llama.cpp's converter marks with
metadata only. The embedding model has ``qwen3.pooling_type`` 3 (last token); the reranker has
pooling type rank with ``cls.output.weight`` = the lm_head rows of "yes" and "no" (in that order,
``classifier.output_labels`` ["yes", "no"]) and no lm_head, and llama.cpp's graph applies a softmax
to those two logits of the last token (``RANK_TOKENS`` are the tiny model's stand-ins for the ids)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

RANK_TOKENS = (17, 42)  # ("yes", "no")


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    if family.name == "qwen3-rerank":
        md["qwen3.pooling_type"] = 4
        md["qwen3.classifier.output_labels"] = ["yes", "no"]
    else:
        md["qwen3.pooling_type"] = 3
    return md


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = hf_tiny.convert(dataclasses.replace(family, convert_fn=None), cfg, sd)
    if family.name == "qwen3-rerank":  # Qwen3Model._get_cls_out_tensor: lm_head[[yes, no]], no lm_head
        out["cls.output.weight"] = np.ascontiguousarray(out.pop("output.weight")[list(RANK_TOKENS)])
    return out


for _name in ("qwen3-embedding", "qwen3-rerank"):
    hf_tiny.register(
        Family(
            _name,
            "qwen3",
            "Qwen3Config",
            dict(head_dim=32),
            kind="encoder",
            convert_fn=_convert,
            metadata_fn=_metadata,
        )
    )
