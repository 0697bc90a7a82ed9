"""Small F32 models for the quantize tests and benchmark, written with our own GGUF writer: shapes and
metadata chosen to reach llama-quantize's per-tensor rules (layer-dependent bumps over 16 layers, GQA 4
and 3, tied embeddings, rows that are not a multiple of 256, 8 experts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamapy.gguf.constants import GGUFValueType
from llamapy.gguf.writer import GGUFWriter
from llamapy.quantize import Imatrix, ImatrixEntry, save_imatrix

# name -> (n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, tied, n_expert)
MODELS: dict[str, tuple[int, int, int, int, int, int, int, bool, int]] = {
    "dense16": (16, 256, 8, 2, 32, 320, 512, False, 0),  # GQA 4; ffn_down rows of 320 fall back
    "tied8": (
        8,
        256,
        6,
        2,
        64,
        512,
        256,
        True,
        0,
    ),  # GQA 3, output shares token_embd, attn_output rows of 384
    "moe8": (2, 256, 4, 4, 64, 256, 256, False, 8),  # 8 experts (the n_expert == 8 rules, MXFP4_MOE)
}


def weights(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    n_layer, d, nh, nkv, hd, ff, nv, tied, ne = MODELS[name]
    rng = np.random.default_rng(seed)

    def r(*shape: int, s: float = 0.2) -> np.ndarray:
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(s)
        # a few outlier columns, as real weights have (exercises the scale searches)
        x[..., :: max(1, shape[-1] // 7)] *= np.float32(4)
        return x

    w = {"token_embd.weight": r(nv, d, s=1.0), "output_norm.weight": 1 + r(d, s=0.1)}
    if not tied:
        w["output.weight"] = r(nv, d)
    for il in range(n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = 1 + r(d, s=0.1)
        w[p + "attn_q.weight"] = r(nh * hd, d)
        w[p + "attn_k.weight"] = r(nkv * hd, d)
        w[p + "attn_v.weight"] = r(nkv * hd, d)
        w[p + "attn_output.weight"] = r(d, nh * hd)
        w[p + "ffn_norm.weight"] = 1 + r(d, s=0.1)
        if ne:
            w[p + "ffn_gate_inp.weight"] = r(ne, d)
            w[p + "ffn_gate_exps.weight"] = r(ne, ff, d)
            w[p + "ffn_up_exps.weight"] = r(ne, ff, d)
            w[p + "ffn_down_exps.weight"] = r(ne, d, ff)
        else:
            w[p + "ffn_gate.weight"] = r(ff, d)
            w[p + "ffn_up.weight"] = r(ff, d)
            w[p + "ffn_down.weight"] = r(d, ff)
    return w


def write_model(name: str, path: str | Path, seed: int = 0, f16: bool = False) -> Path:
    """The model ``name`` as a GGUF file (2-D+ weights F32, or F16 with ``f16``; norms F32)."""
    n_layer, d, nh, nkv, hd, ff, nv, tied, ne = MODELS[name]
    w = GGUFWriter(path, arch="llama")
    u32 = GGUFValueType.UINT32
    meta = {
        "llama.context_length": 256, "llama.embedding_length": d, "llama.block_count": n_layer,
        "llama.feed_forward_length": ff, "llama.attention.head_count": nh, "llama.attention.head_count_kv": nkv,
        "llama.rope.dimension_count": hd, "llama.attention.key_length": hd, "llama.attention.value_length": hd,
        "llama.vocab_size": nv,
    }  # fmt: skip
    if ne:
        meta.update({"llama.expert_count": ne, "llama.expert_used_count": 2})
    w.add_key_value("general.name", f"quantize-test-{name}", GGUFValueType.STRING)
    w.add_key_value("general.file_type", 1 if f16 else 0, u32)
    w.add_metadata(meta, int_type=u32)
    w.add_key_value("llama.attention.layer_norm_rms_epsilon", 1e-5, GGUFValueType.FLOAT32)
    for tname, arr in weights(name, seed).items():
        t = "F16" if f16 and arr.ndim >= 2 else "F32"
        w.add_tensor(tname, arr, ggml_type=t)
    w.write()
    return Path(path)


def write_imatrix(name: str, path: str | Path, seed: int = 1) -> Path:
    """A synthetic importance matrix for model ``name`` (every weight matrix, per expert for MoE)."""
    rng = np.random.default_rng(seed)
    im = Imatrix(datasets=["synthetic"], chunk_count=10, chunk_size=512)
    for tname, arr in weights(name).items():
        if arr.ndim < 2 or not tname.startswith("blk.") or "ffn_gate_inp" in tname:
            continue
        n_mat = arr.shape[0] if arr.ndim == 3 else 1
        counts = np.full(n_mat, 5120, dtype=np.int64)
        sums = (rng.gamma(1.0, 1.0, size=n_mat * arr.shape[-1]) * 5120).astype(np.float32)
        im.entries[tname] = ImatrixEntry(sums, counts)
    save_imatrix(im, path)
    return Path(path)
