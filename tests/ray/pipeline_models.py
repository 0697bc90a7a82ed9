"""Tiny random-weight GGUF files for the pipeline tests, written with NumPy only (no torch): a llama-layout
mixture of experts (3 layers, top-2 of 4 experts) and a Granite-4 hybrid (Mamba-2 and attention layers,
each with MoE and a shared expert), in the shapes of tests/model/hf_tiny.py's families."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType, GGUFWriter
from tests.model.tiny import llama_config, random_llama_weights, write_gguf

N_VOCAB = 256


def tiny_moe(path: Path, seed: int = 3) -> Path:
    """Mixtral-like: llama arch with ``expert_count`` 4, ``expert_used_count`` 2, 3 layers."""
    cfg = llama_config(n_vocab=N_VOCAB, n_layer=3, n_ff=32, n_head=4, n_head_kv=2)
    w = random_llama_weights(cfg, seed)
    rng = np.random.default_rng(seed + 1)
    d, ff, ne = cfg["n_embd"], cfg["n_ff"], 4
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        for k in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
            del w[p + k]
        w[p + "ffn_gate_inp.weight"] = (rng.standard_normal((ne, d)) * 0.5).astype(np.float32)
        w[p + "ffn_gate_exps.weight"] = (rng.standard_normal((ne, ff, d)) * 0.2).astype(np.float32)
        w[p + "ffn_up_exps.weight"] = (rng.standard_normal((ne, ff, d)) * 0.2).astype(np.float32)
        w[p + "ffn_down_exps.weight"] = (rng.standard_normal((ne, d, ff)) * 0.2).astype(np.float32)
    meta = {"llama.expert_count": ne, "llama.expert_used_count": 2}
    return write_gguf(path, "llama", cfg, w, GGMLType.F32, extra_meta=meta)


def tiny_hybrid(path: Path, seed: int = 5) -> Path:
    """granitehybrid: layers mamba, attention, mamba, mamba (tests/model/families/granitehybrid.py)."""
    rng = np.random.default_rng(seed)
    a, d, ne, ff, sh = "granitehybrid", 64, 4, 32, 64
    kinds = ["mamba", "attention", "mamba", "mamba"]

    def r(*shape: int, s: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"token_embd.weight": r(N_VOCAB, d, s=1.0), "output_norm.weight": 1 + r(d, s=0.1)}
    w["output.weight"] = r(N_VOCAB, d)
    for il, kind in enumerate(kinds):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = 1 + r(d, s=0.1)
        w[p + "ffn_norm.weight"] = 1 + r(d, s=0.1)
        w[p + "ffn_gate_inp.weight"] = r(ne, d, s=0.5)
        w[p + "ffn_gate_exps.weight"] = r(ne, ff, d)
        w[p + "ffn_up_exps.weight"] = r(ne, ff, d)
        w[p + "ffn_down_exps.weight"] = r(ne, d, ff)
        w[p + "ffn_gate_shexp.weight"] = r(sh, d)
        w[p + "ffn_up_shexp.weight"] = r(sh, d)
        w[p + "ffn_down_shexp.weight"] = r(d, sh)
        if kind == "attention":
            w[p + "attn_q.weight"] = r(64, d)
            w[p + "attn_k.weight"] = r(32, d)
            w[p + "attn_v.weight"] = r(32, d)
            w[p + "attn_output.weight"] = r(d, 64)
        else:  # Mamba-2: 8 heads of 16, 2 groups, state 16, conv 4, inner 128
            w[p + "ssm_dt.bias"] = r(8, s=0.5)
            w[p + "ssm_a"] = -np.exp(r(8, 1, s=0.5))
            w[p + "ssm_d"] = 1 + r(8, 1, s=0.1)
            w[p + "ssm_conv1d.weight"] = r(192, 4, s=0.3)
            w[p + "ssm_conv1d.bias"] = r(192, s=0.1)
            w[p + "ssm_in.weight"] = r(328, d)
            w[p + "ssm_norm.weight"] = 1 + r(2, 64, s=0.1)
            w[p + "ssm_out.weight"] = r(d, 128)
    meta = {
        f"{a}.vocab_size": N_VOCAB, f"{a}.context_length": 256, f"{a}.embedding_length": d,
        f"{a}.block_count": 4, f"{a}.feed_forward_length": ff, f"{a}.attention.head_count": 4,
        f"{a}.attention.head_count_kv": np.array([0 if k == "mamba" else 2 for k in kinds], dtype=np.uint32),
        f"{a}.attention.key_length": 16, f"{a}.attention.value_length": 16,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.rope.freq_base": 10000.0,
        f"{a}.rope.dimension_count": 16, f"{a}.ssm.conv_kernel": 4, f"{a}.ssm.inner_size": 128,
        f"{a}.ssm.state_size": 16, f"{a}.ssm.time_step_rank": 8, f"{a}.ssm.group_count": 2,
        f"{a}.attention.scale": 0.5, f"{a}.embedding_scale": 3.0, f"{a}.residual_scale": 0.6,
        f"{a}.logit_scale": 4.0, f"{a}.expert_count": ne, f"{a}.expert_used_count": 2,
        f"{a}.expert_shared_feed_forward_length": sh,
    }  # fmt: skip
    wr = GGUFWriter(path, arch=a)
    wr.add_metadata(meta, int_type=GGUFValueType.UINT32)
    for name, arr in w.items():
        wr.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32), ggml_type=GGMLType.F32)
    wr.write()
    wr.close()
    return Path(path)
