"""ERNIE 4.5: interleaved rope (ggml's normal mode, no q/k permutation), tied output. The MoE: a
dense first layer, then top-2 of 4 softmax-routed experts (a random selection bias, weights
renormalized) and a shared expert; with interleave step 2, layer 2 is dense again."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families.glm4moe import convert_special
from tests.model.hf_tiny import Family

_NAMES = {
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
_BIAS = "mlp.gate.moe_statics.e_score_correction_bias"  # [1, E]


def _convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = convert_special(family, cfg, {k: v for k, v in sd.items() if not k.endswith(_BIAS)}, _NAMES)
    for k, v in sd.items():
        if k.endswith(_BIAS):
            out[f"blk.{k.split('.')[2]}.exp_probs_b.bias"] = np.asarray(v, np.float32).reshape(-1)
    return out


def _metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    if a == "ernie4_5-moe":  # Ernie4_5MoeModel.set_gguf_parameters
        md[f"{a}.expert_count"] = cfg.moe_num_experts
        md[f"{a}.expert_used_count"] = cfg.moe_k
        md[f"{a}.interleave_moe_layer_step"] = cfg.moe_layer_interval
        md[f"{a}.leading_dense_block_count"] = cfg.moe_layer_start_index
        md[f"{a}.expert_feed_forward_length"] = cfg.moe_intermediate_size
        md[f"{a}.expert_shared_feed_forward_length"] = cfg.moe_intermediate_size * cfg.moe_num_shared_experts
    return md


hf_tiny.register(
    Family("ernie4_5", "ernie4_5", "Ernie4_5Config", dict(head_dim=16, tie_word_embeddings=True),
           convert_fn=_convert, metadata_fn=_metadata)
)  # fmt: skip
hf_tiny.register(
    Family(
        "ernie4_5-moe",
        "ernie4_5-moe",
        "Ernie4_5_MoeConfig",
        dict(
            num_hidden_layers=4,
            head_dim=16,
            tie_word_embeddings=True,
            moe_num_experts=4,
            moe_k=2,
            moe_intermediate_size=32,
            moe_num_shared_experts=1,
            moe_layer_start_index=1,
            moe_layer_interval=2,
            moe_layer_end_index=3,
        ),
        convert_fn=_convert,
        metadata_fn=_metadata,
        f32_names=(_BIAS,),
    )
)
