"""Jamba: Mamba (1) layers with RMS-normed dt/B/C and attention layers without rope, a mixture of
experts every other layer, converted as llama.cpp's ``JambaModel``: ``A_log`` -> ``ssm_a = -exp(A_log)``
``[d_inner, d_state]``, the conv kernel squeezed, per-layer ``head_count_kv`` with 0 for Mamba."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "pre_ff_layernorm.weight": "ffn_norm.weight",
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.x_proj.weight": "ssm_x.weight",
    "mamba.dt_proj.weight": "ssm_dt.weight",
    "mamba.dt_proj.bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a",
    "mamba.D": "ssm_d",
    "mamba.dt_layernorm.weight": "ssm_dt_norm.weight",
    "mamba.b_layernorm.weight": "ssm_b_norm.weight",
    "mamba.c_layernorm.weight": "ssm_c_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "feed_forward.gate_proj.weight": "ffn_gate.weight",
    "feed_forward.up_proj.weight": "ffn_up.weight",
    "feed_forward.down_proj.weight": "ffn_down.weight",
    "feed_forward.router.weight": "ffn_gate_inp.weight",
    "feed_forward.experts.down_proj": "ffn_down_exps.weight",
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.final_layernorm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
            continue
        il, rest = name[len("model.layers.") :].split(".", 1)
        if rest == "feed_forward.experts.gate_up_proj":  # [E, 2 n_ff, n_embd]: gate first
            n_ff = w.shape[1] // 2
            out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :n_ff])
            out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, n_ff:])
            continue
        if rest == "mamba.A_log":
            w = -np.exp(w)
        elif rest == "mamba.conv1d.weight":
            w = w.reshape(w.shape[0], w.shape[-1])
        out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    a = family.arch
    md[f"{a}.attention.head_count_kv"] = np.array(
        [cfg.num_key_value_heads if t == "attention" else 0 for t in cfg.layers_block_type], dtype=np.uint32
    )
    md[f"{a}.ssm.conv_kernel"] = cfg.mamba_d_conv
    md[f"{a}.ssm.inner_size"] = cfg.mamba_expand * cfg.hidden_size
    md[f"{a}.ssm.state_size"] = cfg.mamba_d_state
    md[f"{a}.ssm.time_step_rank"] = cfg.mamba_dt_rank
    md[f"{a}.expert_count"] = cfg.num_experts
    md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
    return md


hf_tiny.register(
    Family(
        "jamba",
        "jamba",
        "JambaConfig",
        dict(
            num_hidden_layers=4,
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=4,
            attn_layer_offset=2,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=8,
        ),
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv1d.weight", "dt_proj.weight", "ssm_dt.weight", "A_log", "ssm_a"),
    )
)
