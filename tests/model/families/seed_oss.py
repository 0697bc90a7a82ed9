"""Seed-OSS: q/k/v biases, neox rope, the FFN pre-norm named post_attention_norm in the file."""

from __future__ import annotations

from typing import Any

from tests.model import hf_tiny
from tests.model.families.glm4moe import convert_special
from tests.model.hf_tiny import Family


def _convert(family: Family, cfg: Any, sd: dict) -> dict:
    return convert_special(family, cfg, sd, {"post_attention_layernorm.weight": "post_attention_norm.weight"})


hf_tiny.register(Family("seed_oss", "seed_oss", "SeedOssConfig", dict(head_dim=16), convert_fn=_convert))
