"""MiMo-V2-Flash (``MiMoV2FlashForCausalLM``, llama.cpp's arch ``mimo2``): four layers, global /
window / window / global (window 5 < the prompts, the window layers with twice the KV heads and a sink
logit per head, their own rope base), keys and queries 32 wide and values 16, rope on 10 of 32 dims,
V scaled by 0.707, a dense first layer then top-2 of 4 sigmoid-routed experts with a random selection
bias. Converted as llama.cpp's ``MimoV2Model``: per-layer ``head_count_kv`` and
``sliding_window_pattern`` arrays, ``value_length``, ``attention.value_scale``, ``rope.freq_base_swa``;
``post_attention_layernorm`` -> ``ffn_norm``, sinks -> ``attn_sinks.weight``, the fused experts split."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.glm4moe import hf_model_with_bias
from tests.model.hf_tiny import Family

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
        "model.norm.weight": "output_norm.weight"}  # fmt: skip


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name in _TOP:
            out[_TOP[name]] = w
            continue
        if not name.startswith("model.layers."):
            if "rotary_emb" in name:
                continue
            raise KeyError(f"no GGUF name for HF tensor {name!r} (mimo2)")
        il, rest = name[len("model.layers.") :].split(".", 1)
        if rest == "mlp.experts.gate_up_proj":  # [E, 2 n_ff, n_embd]: gate first
            n_ff = w.shape[1] // 2
            out[f"blk.{il}.ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :n_ff])
            out[f"blk.{il}.ffn_up_exps.weight"] = np.ascontiguousarray(w[:, n_ff:])
        else:
            out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    full, local = cfg.rope_parameters["full_attention"], cfg.rope_parameters["sliding_attention"]
    return {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": [cfg.num_key_value_heads * (2 if s else 1) for s in swa],
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.v_head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.attention.sliding_window_pattern": [int(s) for s in swa],
        f"{a}.attention.value_scale": float(cfg.attention_value_scale),
        f"{a}.rope.freq_base": float(full["rope_theta"]),
        f"{a}.rope.freq_base_swa": float(local["rope_theta"]),
        f"{a}.rope.dimension_count": int(cfg.head_dim * full["partial_rotary_factor"]),
        f"{a}.expert_count": cfg.n_routed_experts,
        f"{a}.expert_used_count": cfg.num_experts_per_tok,
        f"{a}.expert_feed_forward_length": cfg.moe_intermediate_size,
    }


hf_tiny.register(
    Family(
        "mimo2",
        "mimo2",
        "MiMoV2FlashConfig",
        dict(
            num_hidden_layers=4,
            head_dim=32,
            v_head_dim=16,
            sliding_window=5,
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=1.0,
            attention_value_scale=0.707,
            rope_parameters={
                "full_attention": {
                    "rope_type": "default",
                    "rope_theta": 50000.0,
                    "partial_rotary_factor": 0.334,
                },
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.334,
                },
            },
        ),
        hf_model=hf_model_with_bias,
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("mlp.gate.weight", "e_score_correction_bias", "sinks", "exp_probs_b.bias"),
    )
)
