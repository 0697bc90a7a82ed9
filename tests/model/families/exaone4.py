"""EXAONE 4.0: post-norms, per-head q/k norms, 3 sliding-window layers (window 4 < the prompts,
rope) then a global one (NoPE)."""

from __future__ import annotations

import dataclasses
from typing import Any

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.glm4moe import convert_special
from tests.model.hf_tiny import Family


def _convert(family: Family, cfg: Any, sd: dict) -> dict:
    return convert_special(family, cfg, sd, {"post_attention_layernorm.weight": "post_attention_norm.weight"})


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    if cfg.sliding_window:  # Exaone4Model.set_gguf_parameters: the window and a per-layer pattern
        md["exaone4.attention.sliding_window"] = cfg.sliding_window
        md["exaone4.attention.sliding_window_pattern"] = [t == "sliding_attention" for t in cfg.layer_types]
    return md


hf_tiny.register(
    Family(
        "exaone4",
        "exaone4",
        "Exaone4Config",
        dict(num_hidden_layers=4, head_dim=16, sliding_window=4, sliding_window_pattern=4),
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
