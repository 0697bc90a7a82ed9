"""GLM-4 (0414): sandwich norms, partial rotary (half of each head, interleaved pairs: ggml's normal
mode, no q/k permutation), q/k/v biases, fused [gate | up] MLP."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_NAMES = {
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_mlp_layernorm.weight": "post_ffw_norm.weight",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rest = {k: v for k, v in sd.items() if not k.endswith(tuple(_NAMES))}
    out = hf_tiny.convert(dataclasses.replace(family, convert_fn=None), cfg, rest)
    for k, v in sd.items():
        for hf, gg in _NAMES.items():
            if k.endswith(hf):
                il = k.split(".")[2]
                out[f"blk.{il}.{gg}"] = np.asarray(v, dtype=np.float32)
    return out


hf_tiny.register(Family("glm4", "glm4", "Glm4Config", dict(head_dim=16), convert_fn=_convert))
