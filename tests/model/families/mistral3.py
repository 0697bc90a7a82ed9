"""Mistral 3 text (Ministral 3): LLaMA's layout under general.architecture "mistral3", YaRN (factor 16
over an original context of 8, so the prompts run past it) and Llama 4's attention temperature
tuning (beta 0.5, so positions 8.. scale Q by 1 + 0.5 ln 2 ...)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

N_CTX_ORIG = 8


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # convert_hf_to_gguf.py's Mistral3Model is a LlamaModel: q/k rows permuted for ggml's normal rope
    return hf_tiny.convert(dataclasses.replace(family, arch="llama", convert_fn=None), cfg, sd)


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    rp, a = cfg.rope_parameters, family.arch
    md[f"{a}.rope.scaling.type"] = "yarn"
    md[f"{a}.rope.scaling.factor"] = float(rp["factor"])
    md[f"{a}.rope.scaling.original_context_length"] = int(rp["original_max_position_embeddings"])
    md[f"{a}.rope.scaling.yarn_beta_fast"] = float(rp["beta_fast"])
    md[f"{a}.rope.scaling.yarn_beta_slow"] = float(rp["beta_slow"])
    md[f"{a}.attention.temperature_scale"] = float(rp["llama_4_scaling_beta"])
    # Ministral3Model writes mscale_all_dim; without it llama.cpp's YaRN attention factor is
    # 1 + 0.1 ln(factor), with it (1.0) HF's get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) = 1
    md[f"{a}.rope.scaling.yarn_log_multiplier"] = float(rp["mscale_all_dim"])
    return md


hf_tiny.register(
    Family(
        "mistral3",
        "mistral3",
        "Ministral3Config",
        dict(
            head_dim=16,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 16.0,
                "original_max_position_embeddings": N_CTX_ORIG,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.5,
            },
        ),
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
