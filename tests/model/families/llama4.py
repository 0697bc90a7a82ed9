"""Llama 4 (text): layer 3 NoPE with temperature tuning (floor 4, scale 0.5, so positions 3.. of the
prompts scale Q), weightless q/k RMS norms on the rope layers, MoE on every 2nd layer (one of 4
experts, input scaled by its sigmoid, plus a shared expert). HF stores the experts [E, in, out]; the
file [E, out, in]. Chunked attention on the rope layers with a chunk of 8 positions, so the 20-token
prompts span three chunks (llamapy's ``swa_type="chunked"`` KV cache window against HF's
``attention_chunk_size`` mask)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.glm4moe import convert_special
from tests.model.hf_tiny import Family

_NAMES = {
    "feed_forward.gate_proj.weight": "ffn_gate.weight",
    "feed_forward.up_proj.weight": "ffn_up.weight",
    "feed_forward.down_proj.weight": "ffn_down.weight",
    "feed_forward.router.weight": "ffn_gate_inp.weight",
    "feed_forward.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "feed_forward.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "feed_forward.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    experts = {k: v for k, v in sd.items() if ".feed_forward.experts." in k}
    out = convert_special(family, cfg, {k: v for k, v in sd.items() if k not in experts}, _NAMES)
    for k, v in experts.items():
        il = k.split(".")[2]
        w = np.ascontiguousarray(np.asarray(v, np.float32).transpose(0, 2, 1))
        if k.endswith("gate_up_proj"):  # [E, 2 n_ff, n_embd]: gate first
            n = w.shape[1] // 2
            out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :n])
            out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, n:])
        else:
            out[f"blk.{il}.ffn_down_exps.weight"] = w
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    md[f"{a}.feed_forward_length"] = cfg.intermediate_size_mlp
    md[f"{a}.expert_feed_forward_length"] = cfg.intermediate_size
    md[f"{a}.expert_count"] = cfg.num_local_experts
    md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
    md[f"{a}.interleave_moe_layer_step"] = cfg.interleave_moe_layer_step
    md[f"{a}.attention.sliding_window"] = cfg.attention_chunk_size
    md[f"{a}.attention.temperature_scale"] = float(cfg.attn_scale)
    md[f"{a}.attention.temperature_length"] = int(cfg.floor_scale)
    return md


hf_tiny.register(
    Family(
        "llama4",
        "llama4",
        "Llama4TextConfig",
        dict(
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size=32,
            intermediate_size_mlp=128,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            attention_chunk_size=8,
            floor_scale=4,
            attn_scale=0.5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
