"""Gemma 4 (text) as llama.cpp's ``conversion/gemma.py`` (Gemma4Model) converts it.

Two tiny cases, each with sliding-window layers (window 4 < the prompts) and global ones, and KV
sharing reaching both kinds (layers 3, 4 reuse layer 1's window cache, layer 5 layer 2's global one):
- ``gemma4``: per-layer embeddings, per-layer head sizes (16 local, 32 global), one KV head on the
  global layers with K reused as V (``attention_k_eq_v``), proportional rope (a quarter of the global
  head), the double-wide MLP on the sharing layers, per-layer output scales, final soft-capping;
- ``gemma4-moe``: the MoE block (a dense MLP beside top-2 of 4 GeGLU experts, router scale and
  per-expert scales), V projections on every layer, no per-layer embeddings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import transformers

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.hf_tiny import FILE_TYPES, Family

_LAYER_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]
_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}

_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "layer_scalar": "layer_output_scale.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}


def _heads(cfg: Any, kind: str) -> tuple[int, int]:
    """Head size and KV heads of the layers of one kind (the config keeps them per layer)."""
    il = cfg.layer_types.index(kind)
    lc = cfg.per_layer_config[il]
    return lc.head_dim, lc.num_key_value_heads


def rope_freqs(cfg: Any) -> np.ndarray:
    """Gemma4Model.generate_extra_tensors: 1 for the rotated pairs of a global head, 1e30 for the rest."""
    rp = cfg.rope_parameters["full_attention"]
    d = _heads(cfg, "full_attention")[0]
    n_rot = int(d * rp["partial_rotary_factor"] / 2)
    return np.array([1.0] * n_rot + [1e30] * (d // 2 - n_rot), dtype=np.float32)


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
        elif name.startswith("model.layers."):
            il, rest = name[len("model.layers.") :].split(".", 1)
            out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out["output.weight"] = w
        else:
            raise KeyError(f"no GGUF name for HF tensor {name!r}")
    out["rope_freqs.weight"] = rope_freqs(cfg)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    n = cfg.num_hidden_layers
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    first_shared = n - cfg.num_kv_shared_layers
    n_ff = [
        cfg.intermediate_size * (2 if cfg.use_double_wide_mlp and il >= first_shared else 1)
        for il in range(n)
    ]
    d_swa, kv_swa = _heads(cfg, "sliding_attention")
    d_full, kv_full = _heads(cfg, "full_attention")
    md: dict[str, Any] = {
        "general.name": f"tiny-{family.name}",
        "general.file_type": FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": n,
        f"{a}.feed_forward_length": n_ff,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": [kv_swa if s else kv_full for s in swa],
        f"{a}.attention.key_length": d_full,
        f"{a}.attention.value_length": d_full,
        f"{a}.attention.key_length_swa": d_swa,
        f"{a}.attention.value_length_swa": d_swa,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.attention.sliding_window_pattern": swa,
        f"{a}.attention.shared_kv_layers": cfg.num_kv_shared_layers,
        f"{a}.embedding_length_per_layer_input": cfg.hidden_size_per_layer_input or 0,
        f"{a}.rope.freq_base": float(cfg.rope_parameters["full_attention"]["rope_theta"]),
        f"{a}.rope.freq_base_swa": float(cfg.rope_parameters["sliding_attention"]["rope_theta"]),
        f"{a}.rope.dimension_count": d_full,
        f"{a}.rope.dimension_count_swa": d_swa,
    }
    if cfg.final_logit_softcapping:
        md[f"{a}.final_logit_softcapping"] = float(cfg.final_logit_softcapping)
    if cfg.enable_moe_block:
        md[f"{a}.expert_count"] = cfg.num_experts
        md[f"{a}.expert_used_count"] = cfg.top_k_experts
        md[f"{a}.expert_feed_forward_length"] = cfg.moe_intermediate_size
    return md


def hf_model(cfg: Any) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():  # layer_scalar is a buffer (the random init leaves it at 1): make it show
        for il, layer in enumerate(model.model.layers):
            layer.layer_scalar.fill_(0.6 + 0.15 * il)
    return model


_COMMON = dict(
    num_hidden_layers=6,
    head_dim=16,
    global_head_dim=32,
    layer_types=_LAYER_TYPES,
    num_kv_shared_layers=3,
    sliding_window=4,
    rope_parameters=_ROPE,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
)

hf_tiny.register(
    Family(
        "gemma4",
        "gemma4",
        "Gemma4TextConfig",
        dict(
            _COMMON,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=32,
            vocab_size_per_layer_input=hf_tiny.N_VOCAB,
            use_double_wide_mlp=True,
            final_logit_softcapping=15.0,
        ),
        hf_model=hf_model,
        convert_fn=convert,
        metadata_fn=metadata,
    )
)

hf_tiny.register(
    Family(
        "gemma4-moe",
        "gemma4",
        "Gemma4TextConfig",
        dict(
            _COMMON,
            hidden_size_per_layer_input=0,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
            # transformers 5.24 slices per-layer inputs before the KV-sharing layers even when there are
            # none (a TypeError); asking for hidden states turns that shortcut off
            output_hidden_states=True,
        ),
        hf_model=hf_model,
        convert_fn=convert,
        metadata_fn=metadata,
    )
)
