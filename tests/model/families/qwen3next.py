"""Qwen3-Next: Qwen3.5's hybrid layers with MoE everywhere, converted as llama.cpp's ``Qwen3NextModel``:
``in_proj_qkvz`` (per key head ``[q, k, v, z]``) split into ``attn_qkv`` (all q, all k, all v) and
``attn_gate`` (z), ``in_proj_ba`` kept whole as ``ssm_ba``, value heads left grouped by key head, (1 + w)
norms stored as such, ``A_log`` -> ``ssm_a = -exp(A_log)``."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.model import hf_tiny
from tests.model.families import qwen35
from tests.model.hf_tiny import Family


def convert(family: Family, cfg: Any, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n_k, n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = n_v // n_k
    rest: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for name, w in sd.items():
        w = np.asarray(w, dtype=np.float32)
        if name.endswith("linear_attn.in_proj_qkvz.weight"):
            il = name.split(".")[2]
            g = w.reshape(n_k, 2 * dk + 2 * r * dv, -1)
            q, k = g[:, :dk], g[:, dk : 2 * dk]
            v, z = g[:, 2 * dk : 2 * dk + r * dv], g[:, 2 * dk + r * dv :]
            flat = [x.reshape(-1, w.shape[1]) for x in (q, k, v)]
            out[f"blk.{il}.attn_qkv.weight"] = np.ascontiguousarray(np.concatenate(flat))
            out[f"blk.{il}.attn_gate.weight"] = np.ascontiguousarray(z.reshape(-1, w.shape[1]))
        elif name.endswith("linear_attn.in_proj_ba.weight"):
            out[f"blk.{name.split('.')[2]}.ssm_ba.weight"] = np.ascontiguousarray(w)
        else:
            rest[name] = w
    # the rest as Qwen3.5's converter, whose value-head reordering does not apply (n_k == n_v there)
    plain = type("Cfg", (), {**{k: getattr(cfg, k) for k in ("linear_key_head_dim", "linear_value_head_dim")},
                             "linear_num_key_heads": 1, "linear_num_value_heads": 1})()  # fmt: skip
    out.update(qwen35.convert(family, plain, rest))
    return out


hf_tiny.register(
    Family(
        "qwen3next",
        "qwen3next",
        "Qwen3NextConfig",
        dict(
            num_hidden_layers=4,
            head_dim=32,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
        convert_fn=convert,
        metadata_fn=qwen35.metadata,
        f32_names=("conv1d.weight",),
    )
)
