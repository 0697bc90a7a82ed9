"""DeepSeek V3 (deepseek2): MLA with a q low-rank projection, YaRN (factor 4 over an original
context of 8, mscale 1), a dense first layer, then top-2 of 8 sigmoid-routed experts in 4 groups of
which 2 are used (a random selection bias, weights normalized and scaled 2.5) plus a shared expert;
one next-token-prediction layer in the file, skipped.

``deepseek2``: the file as convert_hf_to_gguf.py writes it today (kv_b split into the absorbed
``attn_k_b`` / ``attn_v_b``; a single KV head of kv_lora_rank + rope dims: the K-only latent
cache). ``deepseek2-mha``: the older layout (``attn_kv_b`` decompressed into per-head K and V), with
a full ``attn_q`` (V2-Lite's) and no YaRN."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.glm4moe import add_nextn_layer, convert_special, hf_model_with_bias, moe_metadata
from tests.model.hf_tiny import Family

_NAMES = {
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


def _mla(family: Family) -> bool:
    return family.name == "deepseek2"


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = convert_special(family, cfg, sd, _NAMES)
    if _mla(family):  # DeepseekV2Model.modify_tensors: kv_b -> k_b (transposed per head), v_b
        H, nope, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        for k in [k for k in out if k.endswith("attn_kv_b.weight")]:
            kv_b = out.pop(k).reshape(H, nope + dv, cfg.kv_lora_rank)
            out[k.replace("attn_kv_b", "attn_k_b")] = np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1))
            out[k.replace("attn_kv_b", "attn_v_b")] = np.ascontiguousarray(kv_b[:, nope:])
    add_nextn_layer(out, cfg.num_hidden_layers, cfg.hidden_size)
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = "deepseek2"
    H, rank, rope = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    md: dict[str, Any] = {
        "general.name": f"tiny-{family.name}",
        "general.file_type": hf_tiny.FILE_TYPES[ftype],
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.block_count": cfg.num_hidden_layers + 1,
        f"{a}.nextn_predict_layers": 1,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": H,
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.kv_lora_rank": rank,
        f"{a}.rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
        f"{a}.rope.dimension_count": rope,
        f"{a}.expert_group_count": cfg.n_group,
        f"{a}.expert_group_used_count": cfg.topk_group,
    }
    md.update(moe_metadata(a, cfg))
    if cfg.q_lora_rank:
        md[f"{a}.attention.q_lora_rank"] = cfg.q_lora_rank
    if _mla(family):
        md[f"{a}.attention.head_count_kv"] = 1
        md[f"{a}.attention.key_length"] = rank + rope
        md[f"{a}.attention.value_length"] = rank
        md[f"{a}.attention.key_length_mla"] = cfg.qk_nope_head_dim + rope
        md[f"{a}.attention.value_length_mla"] = cfg.v_head_dim
    else:
        md[f"{a}.attention.head_count_kv"] = H
        md[f"{a}.attention.key_length"] = cfg.qk_nope_head_dim + rope
        md[f"{a}.attention.value_length"] = cfg.v_head_dim
    rp = cfg.rope_parameters
    if rp.get("rope_type") == "yarn":
        md[f"{a}.rope.scaling.type"] = "yarn"
        md[f"{a}.rope.scaling.factor"] = float(rp["factor"])
        md[f"{a}.rope.scaling.original_context_length"] = int(rp["original_max_position_embeddings"])
        md[f"{a}.rope.scaling.yarn_log_multiplier"] = 0.1 * float(rp["mscale_all_dim"])
        md[f"{a}.rope.scaling.yarn_beta_fast"] = float(rp["beta_fast"])
        md[f"{a}.rope.scaling.yarn_beta_slow"] = float(rp["beta_slow"])
    return md


_CONFIG = dict(
    num_hidden_layers=3,
    num_key_value_heads=4,
    intermediate_size=128,
    q_lora_rank=32,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    rope_interleave=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)
# k_b is the transpose of kv_b's rows: quantizing it along other rows than HF's would not be the
# oracle's weights, so the MLA projections stay F32 in every file (llama.cpp quantizes them)
_F32 = ("kv_b_proj.weight", "attn_kv_b.weight", "attn_k_b.weight", "attn_v_b.weight")

hf_tiny.register(
    Family(
        "deepseek2",
        "deepseek2",
        "DeepseekV3Config",
        _CONFIG,
        hf_model=hf_model_with_bias,
        convert_fn=_convert,
        metadata_fn=_metadata,
        f32_names=_F32,
    )
)
hf_tiny.register(
    Family(
        "deepseek2-mha",
        "deepseek2",
        "DeepseekV3Config",
        dict(
            _CONFIG,
            q_lora_rank=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        hf_model=hf_model_with_bias,
        convert_fn=_convert,
        metadata_fn=_metadata,
    )
)
