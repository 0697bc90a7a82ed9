"""Qwen3.5 (dense and MoE): Gated DeltaNet layers and gated full attention, converted as llama.cpp's
``Qwen3_5TextModel`` / ``Qwen3_5MoeTextModel``: (1 + w) norms stored as such (not the gated
``linear_attn.norm``), ``A_log`` -> ``ssm_a = -exp(A_log)``, the conv kernel squeezed, and the value
heads reordered from grouped-by-key-head to tiled (``_LinearAttentionVReorderBase``) in every tensor that
has them. Four layers: three linear-attention, the fourth full attention."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_TOP = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
        "model.norm.weight": "output_norm.weight"}  # fmt: skip
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}


def _reorder_v(w: np.ndarray, axis: int, n_k: int, n_v: int, head: int) -> np.ndarray:
    """Value heads from grouped by key head ([k0: v0..v(r-1), k1: ...]) to tiled ([v0 of k0, v0 of k1,
    ...])."""
    shape = list(w.shape)
    w = w.reshape(shape[:axis] + [n_k, n_v // n_k, head] + shape[axis + 1 :])
    return np.ascontiguousarray(np.swapaxes(w, axis, axis + 1)).reshape(shape)


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n_k, n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            gname = _TOP[name]
            if name == "model.norm.weight":
                w = w + np.float32(1.0)
        elif name.startswith("model.layers."):
            il, rest = name[len("model.layers.") :].split(".", 1)
            if rest.endswith("experts.gate_up_proj"):  # [E, 2 n_ff, n_embd]: gate first
                n_ff = w.shape[1] // 2
                out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :n_ff])
                out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, n_ff:])
                continue
            gname = f"blk.{il}.{_LAYER[rest]}"
            if rest == "linear_attn.A_log":
                w = -np.exp(w)
            if rest == "linear_attn.conv1d.weight":
                w = w.reshape(w.shape[0], w.shape[-1])
            if rest.endswith("norm.weight") and not rest.startswith("linear_attn."):
                w = w + np.float32(1.0)
            if n_k != n_v and rest.startswith("linear_attn."):
                kind = rest.split(".")[1]
                if kind in ("in_proj_qkv", "conv1d"):
                    qk = 2 * n_k * dk
                    w = np.concatenate([w[:qk], _reorder_v(w[qk:], 0, n_k, n_v, dv)])
                elif kind == "in_proj_z":
                    w = _reorder_v(w, 0, n_k, n_v, dv)
                elif kind in ("in_proj_a", "in_proj_b", "A_log", "dt_bias"):
                    w = _reorder_v(w, 0, n_k, n_v, 1)
                elif kind == "out_proj":
                    w = _reorder_v(w, 1, n_k, n_v, dv)
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
        out[gname] = np.ascontiguousarray(w)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    a = family.arch
    md[f"{a}.ssm.conv_kernel"] = cfg.linear_conv_kernel_dim
    md[f"{a}.ssm.state_size"] = cfg.linear_key_head_dim
    md[f"{a}.ssm.group_count"] = cfg.linear_num_key_heads
    md[f"{a}.ssm.time_step_rank"] = cfg.linear_num_value_heads
    md[f"{a}.ssm.inner_size"] = cfg.linear_value_head_dim * cfg.linear_num_value_heads
    md[f"{a}.full_attention_interval"] = 4
    if "mrope_section" in cfg.rope_parameters:
        md[f"{a}.rope.dimension_sections"] = [*cfg.rope_parameters["mrope_section"], 0]
    if a in ("qwen35moe", "qwen3next"):
        md[f"{a}.expert_count"] = cfg.num_experts
        md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
        md[f"{a}.expert_feed_forward_length"] = cfg.moe_intermediate_size
        md[f"{a}.expert_shared_feed_forward_length"] = cfg.shared_expert_intermediate_size
    return md


_LINEAR = dict(
    num_hidden_layers=4,
    head_dim=32,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
)
_HOOKS = dict(convert_fn=convert, metadata_fn=metadata, f32_names=("conv1d.weight",))

hf_tiny.register(Family("qwen35", "qwen35", "Qwen3_5TextConfig", dict(_LINEAR), **_HOOKS))
hf_tiny.register(
    Family(
        "qwen35moe",
        "qwen35moe",
        "Qwen3_5MoeTextConfig",
        dict(
            _LINEAR,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
        **_HOOKS,
    )
)
