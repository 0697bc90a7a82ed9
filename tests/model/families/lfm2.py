"""LFM2: short-convolution layers beside attention layers, converted as llama.cpp's ``LFM2Model``: the
conv kernel squeezed to ``[C, L]``, per-layer ``head_count_kv`` with 0 for the conv layers, the final
``embedding_norm`` stored as ``token_embd_norm``. Four layers, the last one a conv layer."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_TOP = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
        "model.embedding_norm.weight": "token_embd_norm.weight"}  # fmt: skip
_LAYER = {
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "feed_forward.gate.weight": "ffn_gate_inp.weight",
    "feed_forward.expert_bias": "exp_probs_b.bias",
    "feed_forward.experts.down_proj": "ffn_down_exps.weight",
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
        if rest == "conv.conv.weight":
            w = w.reshape(w.shape[0], w.shape[-1])
        out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    a = family.arch
    md[f"{a}.attention.head_count_kv"] = np.array(
        [0 if t == "conv" else cfg.num_key_value_heads for t in cfg.layer_types], dtype=np.uint32
    )
    md[f"{a}.attention.layer_norm_rms_epsilon"] = float(cfg.norm_eps)
    md[f"{a}.shortconv.l_cache"] = cfg.conv_L_cache
    if a == "lfm2moe":
        md[f"{a}.expert_count"] = cfg.num_experts
        md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
        md[f"{a}.expert_feed_forward_length"] = cfg.moe_intermediate_size
        md[f"{a}.leading_dense_block_count"] = cfg.num_dense_layers
        md[f"{a}.expert_gating_func"] = 2  # sigmoid
    return md


def _moe_model(cfg: Any) -> Any:
    """The transformers model with a nonzero expert selection bias (a buffer, not randomized)."""
    import torch
    import transformers

    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    for layer in m.model.layers:
        fb = getattr(layer.feed_forward, "expert_bias", None)
        if fb is not None:
            fb.copy_(torch.randn(fb.shape, generator=g) * 0.3)
    return m


hf_tiny.register(
    Family(
        "lfm2",
        "lfm2",
        "Lfm2Config",
        dict(
            num_hidden_layers=4,
            layer_types=["conv", "full_attention", "conv", "conv"],
            block_auto_adjust_ff_dim=False,
            norm_eps=1e-6,
            conv_L_cache=3,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv.conv.weight",),
    )
)
hf_tiny.register(
    Family(
        "lfm2moe",
        "lfm2moe",
        "Lfm2MoeConfig",
        dict(
            num_hidden_layers=4,
            layer_types=["conv", "full_attention", "conv", "conv"],
            norm_eps=1e-6,
            conv_L_cache=3,
            moe_intermediate_size=32,
            num_dense_layers=1,
            num_experts=4,
            num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        hf_model=_moe_model,
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv.conv.weight", "feed_forward.gate.weight"),
    )
)
