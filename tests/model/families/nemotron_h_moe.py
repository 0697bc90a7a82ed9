"""Nemotron-H with experts (``nemotron_h_moe``), converted as llama.cpp's ``NemotronHModel`` does when the
config has ``num_experts_per_tok``: Mamba2 and attention layers as ``nemotron_h``'s; each ``moe`` layer's
router as ``ffn_gate_inp`` (F32) with its correction bias as ``exp_probs_b.bias``, the stacked gate-less
experts as ``ffn_{up,down}_exps``, the shared expert as ``ffn_{up,down}_shexp`` and the latent projections
(Super) as ``ffn_latent_{down,up}``; ``feed_forward_length`` is the expert width on the MoE layers.

Two cases: the shape of Nemotron 3 Nano 30B-A3B (sigmoid routing with a random correction bias, top-2 of 8,
one group, normalized weights scaled by 2.5, one shared expert) and of Nemotron 3 Super (the same with a
latent expert width, and the MTP head the converter appends as one more block, which llamapy skips)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families import glm4moe, nemotron_h
from tests.model.hf_tiny import Family

_MOE = {
    "gate.weight": "ffn_gate_inp.weight",
    "gate.e_score_correction_bias": "exp_probs_b.bias",
    "experts.up_proj": "ffn_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "fc1_latent_proj.weight": "ffn_latent_down.weight",
    "fc2_latent_proj.weight": "ffn_latent_up.weight",
}


def _moe_mixer(cfg: Any, name: str) -> tuple[str, str] | None:
    """(layer, the mixer's tensor name) of a MoE layer's mixer tensor, else None."""
    if not name.startswith("model.layers."):
        return None
    il, rest = name[len("model.layers.") :].split(".", 1)
    if cfg.layers_block_type[int(il)] != "moe" or not rest.startswith("mixer."):
        return None
    return il, rest[len("mixer.") :]


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    moe = {k: v for k, v in sd.items() if _moe_mixer(cfg, k)}
    out = nemotron_h.convert(family, cfg, {k: v for k, v in sd.items() if k not in moe})
    for name, w in moe.items():
        il, rest = _moe_mixer(cfg, name)  # type: ignore[misc]
        out[f"blk.{il}.{_MOE[rest]}"] = np.ascontiguousarray(w, dtype=np.float32)
    if family.name.endswith("-mtp"):
        glm4moe.add_nextn_layer(out, len(cfg.layers_block_type), cfg.hidden_size)
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    a = family.arch
    md = nemotron_h.metadata(family, cfg, ftype)
    types = list(cfg.layers_block_type)
    kv = [cfg.num_key_value_heads if t == "full_attention" else 0 for t in types]
    ff = [cfg.moe_intermediate_size if t == "moe" else 0 for t in types]
    if family.name.endswith("-mtp"):  # the MTP block: attention and MoE in one
        kv.append(cfg.num_key_value_heads)
        ff.append(cfg.moe_intermediate_size)
        md[f"{a}.nextn_predict_layers"] = 1
    md[f"{a}.block_count"] = len(kv)
    md[f"{a}.attention.head_count_kv"] = np.array(kv, dtype=np.uint32)
    md[f"{a}.feed_forward_length"] = np.array(ff, dtype=np.uint32)
    md.update(
        {
            f"{a}.expert_used_count": cfg.num_experts_per_tok,
            f"{a}.expert_feed_forward_length": cfg.moe_intermediate_size,
            f"{a}.expert_shared_feed_forward_length": cfg.moe_shared_expert_intermediate_size,
            f"{a}.expert_count": cfg.n_routed_experts,
            f"{a}.expert_shared_count": cfg.n_shared_experts,
            f"{a}.expert_weights_norm": bool(cfg.norm_topk_prob),
            f"{a}.expert_weights_scale": float(cfg.routed_scaling_factor),
            f"{a}.expert_group_count": cfg.n_group,
        }
    )
    if cfg.moe_latent_size is not None:
        md[f"{a}.moe_latent_size"] = cfg.moe_latent_size
    return md


_NANO = hf_tiny.FAMILIES["nemotron_h"].config_kw | dict(
    layers_block_type=["linear_attention", "moe", "full_attention", "linear_attention", "moe"],
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=64,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
)

for _name, _kw in (("nemotron_h_moe", {}), ("nemotron_h_moe-latent-mtp", dict(moe_latent_size=32))):
    hf_tiny.register(
        Family(
            _name,
            "nemotron_h_moe",
            "NemotronHConfig",
            _NANO | _kw,
            hf_model=glm4moe.hf_model_with_bias,
            convert_fn=convert,
            metadata_fn=metadata,
            f32_names=("conv1d.weight", "ssm_a", "ssm_d", "mixer.gate.weight"),
            common_config=False,
        )
    )
