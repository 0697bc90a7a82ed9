"""Falcon-H1: Mamba2 and attention side by side in every layer, converted as llama.cpp's ``FalconH1Model``,
which folds the muP multipliers into the weights (embeddings, lm head, attention in/out and key, the SSM's
in/out and its per-segment ``mup_vector`` on ``in_proj``, the MLP's gate and down); the Mamba2 tensors as
``Mamba2Model``'s. Multipliers away from 1 so that each fold shows (powers of two: folding them into F16 /
Q8_0 weights is exact, as the oracle's runtime multiplication)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from tests.model import hf_tiny
from tests.model.families import mamba2
from tests.model.hf_tiny import Family

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "pre_ff_layernorm.weight": "ffn_norm",  # (as convert_hf_to_gguf.py writes it, without .weight)
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "feed_forward.gate_proj.weight": "ffn_gate.weight",
    "feed_forward.up_proj.weight": "ffn_up.weight",
    "feed_forward.down_proj.weight": "ffn_down.weight",
}


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from transformers.models.falcon_h1.modeling_falcon_h1 import compute_mup_vector

    mup = compute_mup_vector(cfg).reshape(-1).numpy().astype(np.float32)
    gm, dm = cfg.mlp_multipliers
    ain = cfg.attention_in_multiplier
    scale = {
        "self_attn.q_proj.weight": ain,
        "self_attn.k_proj.weight": ain * cfg.key_multiplier,
        "self_attn.v_proj.weight": ain,
        "self_attn.o_proj.weight": cfg.attention_out_multiplier,
        "feed_forward.gate_proj.weight": gm,
        "feed_forward.down_proj.weight": dm,
    }
    out: dict[str, np.ndarray] = {}
    ssm: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w * np.float32(cfg.embedding_multiplier)
        elif name == "lm_head.weight":
            out["output.weight"] = w * np.float32(cfg.lm_head_multiplier)
        elif name == "model.final_layernorm.weight":
            out["output_norm.weight"] = w
        else:
            il, rest = name[len("model.layers.") :].split(".", 1)
            if rest.startswith("mamba."):
                if rest == "mamba.in_proj.weight":
                    w = w * (mup[:, None] * np.float32(cfg.ssm_in_multiplier))
                elif rest == "mamba.out_proj.weight":
                    w = w * np.float32(cfg.ssm_out_multiplier)
                ssm[f"backbone.layers.{il}.mixer.{rest[len('mamba.') :]}"] = w
            else:
                out[f"blk.{il}.{_LAYER[rest]}"] = np.ascontiguousarray(w * np.float32(scale.get(rest, 1.0)))
    out.update(mamba2.convert(family, type("Cfg", (), {"n_groups": cfg.mamba_n_groups})(), ssm))
    return out


def metadata(family: Family, cfg: Any, ftype: GGMLType) -> dict[str, Any]:
    import dataclasses

    md = hf_tiny.metadata(dataclasses.replace(family, metadata_fn=None), cfg, ftype)
    a = family.arch
    md[f"{a}.ssm.conv_kernel"] = cfg.mamba_d_conv
    md[f"{a}.ssm.inner_size"] = cfg.mamba_d_ssm
    md[f"{a}.ssm.state_size"] = cfg.mamba_d_state
    md[f"{a}.ssm.time_step_rank"] = cfg.mamba_n_heads
    md[f"{a}.ssm.group_count"] = cfg.mamba_n_groups
    return md


hf_tiny.register(
    Family(
        "falcon-h1",
        "falcon-h1",
        "FalconH1Config",
        dict(
            num_hidden_layers=3,
            mamba_d_ssm=128,
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_n_groups=2,
            mamba_d_state=16,
            mamba_d_conv=4,
            embedding_multiplier=2.0,
            lm_head_multiplier=0.5,
            key_multiplier=0.5,
            attention_in_multiplier=2.0,
            attention_out_multiplier=0.5,
            ssm_in_multiplier=2.0,
            ssm_out_multiplier=0.5,
            mlp_multipliers=[2.0, 0.5],
            ssm_multipliers=[1.0, 2.0, 0.5, 2.0, 0.25],
        ),
        convert_fn=convert,
        metadata_fn=metadata,
        f32_names=("conv1d.weight", "ssm_a", "ssm_d"),
    )
)
