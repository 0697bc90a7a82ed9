"""Granite 4 hybrid: Mamba2 layers and NoPE attention layers, a mixture of experts plus a shared expert,
Granite's four multipliers away from 1; converted as llama.cpp's ``GraniteHybridModel`` (Mamba2's mixer
tensors as ``Mamba2Model``, the shared MLP's fused input split into gate and up, per-layer
``head_count_kv`` with 0 for the Mamba2 layers)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families import mamba2
from tests.model.hf_tiny import Family

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "block_sparse_moe.router.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.experts.down_proj": "ffn_down_exps.weight",
    "shared_mlp.output_linear.weight": "ffn_down_shexp.weight",
}


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    mixer: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}  # fmt: skip
        if name in top:
            out[top[name]] = w
            continue
        il, rest = name[len("model.layers.") :].split(".", 1)
        if rest.startswith("mamba."):
            mixer[f"backbone.layers.{il}.mixer.{rest[len('mamba.') :]}"] = w
        elif rest == "block_sparse_moe.experts.gate_up_proj":
            n_ff = w.shape[1] // 2
            out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :n_ff])
            out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, n_ff:])
        elif rest == "shared_mlp.input_linear.weight":
            n_sh = w.shape[0] // 2
            out[f"blk.{il}.ffn_gate_shexp.weight"] = np.ascontiguousarray(w[:n_sh])
            out[f"blk.{il}.ffn_up_shexp.weight"] = np.ascontiguousarray(w[n_sh:])
        else:
            out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
    groups = type("Cfg", (), {"n_groups": cfg.mamba_n_groups})()
    out.update(mamba2.convert(family, groups, mixer))
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    import dataclasses

    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    a = family.arch
    md[f"{a}.attention.head_count_kv"] = np.array(
        [cfg.num_key_value_heads if t == "full_attention" else 0 for t in cfg.layers_block_type],
        dtype=np.uint32,
    )
    md[f"{a}.ssm.conv_kernel"] = cfg.mamba_d_conv
    md[f"{a}.ssm.inner_size"] = cfg.mamba_n_heads * cfg.mamba_d_head
    md[f"{a}.ssm.state_size"] = cfg.mamba_d_state
    md[f"{a}.ssm.time_step_rank"] = cfg.mamba_n_heads
    md[f"{a}.ssm.group_count"] = cfg.mamba_n_groups
    md[f"{a}.attention.scale"] = float(cfg.attention_multiplier)
    md[f"{a}.embedding_scale"] = float(cfg.embedding_multiplier)
    md[f"{a}.residual_scale"] = float(cfg.residual_multiplier)
    md[f"{a}.logit_scale"] = float(cfg.logits_scaling)
    md[f"{a}.expert_count"] = cfg.num_local_experts
    md[f"{a}.expert_used_count"] = cfg.num_experts_per_tok
    md[f"{a}.expert_shared_feed_forward_length"] = cfg.shared_intermediate_size
    md[f"{a}.rope.scaling.finetuned"] = False
    return md


hf_tiny.register(
    Family(
        "granitehybrid",
        "granitehybrid",
        "GraniteMoeHybridConfig",
        dict(
            intermediate_size=32,
            num_hidden_layers=4,
            layer_types=["mamba", "attention", "mamba", "mamba"],
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=64,
            mamba_n_heads=8,
            mamba_n_groups=2,
            mamba_d_state=16,
            mamba_d_head=16,
            mamba_d_conv=4,
            mamba_expand=2,
            embedding_multiplier=3.0,
            attention_multiplier=0.5,
            residual_multiplier=0.6,
            logits_scaling=4.0,
        ),
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv1d.weight", "ssm_a", "ssm_d"),
    )
)
