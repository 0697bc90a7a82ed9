"""Qwen2-VL / Qwen2.5-VL text model (``qwen2vl``): the language half of a tiny
Qwen2_5_VLForConditionalGeneration (its vision tower is built and ignored), converted as llama.cpp's
``Qwen2VLModel`` does: Qwen2's tensors plus ``rope.dimension_sections`` (the config's ``mrope_section``,
padded to 4). Text-only prompts: HF gives every token one position in all three sections, so this checks
the M-RoPE op with one position per token; image positions are checked in tests/mtmd/test_qwen2vl.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

MROPE_SECTION = [2, 3, 3]  # head_dim 16: 8 rotary dim pairs
TINY_VISION = dict(  # rows of 32 values, so that a Q8_0 file can hold them too
    depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=32, spatial_merge_size=2,
    temporal_patch_size=2, window_size=128, fullatt_block_indexes=[0],
)  # fmt: skip
_TEXT_PREFIXES = ("model.language_model.", "model.")


def hf_model(cfg: Any) -> torch.nn.Module:
    """A Qwen2_5_VLForConditionalGeneration around the text config ``cfg``."""
    full = transformers.Qwen2_5_VLConfig(
        text_config=cfg.to_dict(),
        vision_config=dict(TINY_VISION, out_hidden_size=cfg.hidden_size),
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    for c in (full, full.text_config, full.vision_config):
        c._attn_implementation = "eager"
    return transformers.Qwen2_5_VLForConditionalGeneration(full)


def text_state(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The language model's tensors under Qwen2ForCausalLM's names (``model.layers.0...``)."""
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        if k.startswith("model.visual."):
            continue
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model.") :]
        out[k] = v
    return out


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    cfg = getattr(cfg, "text_config", cfg)
    return hf_tiny.convert(dataclasses.replace(family, convert_fn=None), cfg, text_state(sd))


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    cfg = getattr(cfg, "text_config", cfg)
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    sec = list(cfg.rope_parameters["mrope_section"])
    md[f"{family.arch}.rope.dimension_sections"] = sec + [0] * (4 - len(sec))
    return md


QWEN2VL = hf_tiny.register(
    Family(
        "qwen2vl",
        "qwen2vl",
        "Qwen2_5_VLTextConfig",
        dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE_SECTION}),
        hf_model=hf_model,
        convert_fn=convert,
        metadata_fn=metadata,
    )
)
