"""GLM-4.5 (glm4moe): a dense first layer, then top-2 of 4 sigmoid-routed experts (a random
selection bias, weights renormalized and scaled by 2) plus a shared expert; q/k/v biases, per-head
q/k norms, partial neox rotary. The file carries one next-token-prediction layer after the trunk
(as convert_hf_to_gguf.py writes GLM-4.5's), which llamapy must skip; HF has none."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import Family

_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


def hf_model_with_bias(cfg: Any) -> torch.nn.Module:
    """The model with a random expert-selection bias (a buffer: the shared randomizer leaves it 0)."""
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32
    )
    g = torch.Generator().manual_seed(7)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(torch.randn(buf.shape, generator=g) * 0.3)
    return model


def convert_special(family: Family, cfg: Any, sd: dict[str, np.ndarray], names: dict[str, str]) -> dict:
    """``names`` (HF layer suffix -> GGUF) first, the rest through the shared mapping."""
    rest = {k: v for k, v in sd.items() if not k.endswith(tuple(names))}
    out = hf_tiny.convert(dataclasses.replace(family, convert_fn=None), cfg, rest)
    for k, v in sd.items():
        for hf, gg in names.items():
            if k.endswith(hf):
                out[f"blk.{k.split('.')[2]}.{gg}"] = np.asarray(v, dtype=np.float32)
    return out


def add_nextn_layer(out: dict[str, np.ndarray], n_layer: int, n_embd: int) -> None:
    """A next-token-prediction layer ``blk.{n_layer}`` (a copy of the last layer plus its eh_proj
    and norms), as the real files have: present in the file, unused by the trunk."""
    last = f"blk.{n_layer - 1}."
    for k in [k for k in out if k.startswith(last)]:
        out[f"blk.{n_layer}." + k[len(last) :]] = out[k].copy()
    rng = np.random.default_rng(0)
    out[f"blk.{n_layer}.nextn.eh_proj.weight"] = rng.standard_normal((n_embd, 2 * n_embd)).astype(np.float32)
    out[f"blk.{n_layer}.nextn.enorm.weight"] = np.ones(n_embd, np.float32)
    out[f"blk.{n_layer}.nextn.hnorm.weight"] = np.ones(n_embd, np.float32)


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = convert_special(family, cfg, sd, _NAMES)
    add_nextn_layer(out, cfg.num_hidden_layers, cfg.hidden_size)
    return out


def moe_metadata(a: str, cfg: Any) -> dict[str, Any]:
    return {
        f"{a}.expert_count": cfg.n_routed_experts,
        f"{a}.expert_used_count": cfg.num_experts_per_tok,
        f"{a}.expert_feed_forward_length": cfg.moe_intermediate_size,
        f"{a}.expert_shared_count": cfg.n_shared_experts,
        f"{a}.leading_dense_block_count": cfg.first_k_dense_replace,
        f"{a}.expert_weights_scale": float(cfg.routed_scaling_factor),
        f"{a}.expert_weights_norm": bool(cfg.norm_topk_prob),
        f"{a}.expert_gating_func": 2,  # sigmoid
    }


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    md.update(moe_metadata(a, cfg))
    md[f"{a}.block_count"] = cfg.num_hidden_layers + 1
    md[f"{a}.nextn_predict_layers"] = 1
    return md


hf_tiny.register(
    Family(
        "glm4moe",
        "glm4moe",
        "Glm4MoeConfig",
        dict(
            num_hidden_layers=3,
            head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.0,
            use_qk_norm=True,
            attention_bias=True,
            num_nextn_predict_layers=1,
        ),
        hf_model=hf_model_with_bias,
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
