"""Tiny random-weight GGUF models written with our own writer, for loader/context tests and for the
comparison against Hugging Face transformers (tests/model/test_arch_hf.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from llamapy.gguf.writer import GGUFWriter


def llama_config(**kw: Any) -> dict[str, Any]:
    cfg = dict(
        n_vocab=64, n_embd=64, n_layer=2, n_head=2, n_head_kv=1, n_ff=96, n_ctx=256, head_dim=None,
        rope_base=10000.0, eps=1e-5,
    )  # fmt: skip
    cfg.update(kw)
    return cfg


def random_llama_weights(cfg: dict[str, Any], seed: int = 0, tied: bool = False) -> dict[str, np.ndarray]:
    """GGUF-named float32 weights of a llama-layout model."""
    rng = np.random.default_rng(seed)
    d, nv, ff = cfg["n_embd"], cfg["n_vocab"], cfg["n_ff"]
    hd = cfg["head_dim"] or d // cfg["n_head"]
    nq, nk = cfg["n_head"] * hd, cfg["n_head_kv"] * hd

    def r(*shape: int, s: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"token_embd.weight": r(nv, d, s=1.0), "output_norm.weight": 1.0 + r(d, s=0.1)}
    if not tied:
        w["output.weight"] = r(nv, d)
    for il in range(cfg["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = 1.0 + r(d, s=0.1)
        w[p + "attn_q.weight"] = r(nq, d)
        w[p + "attn_k.weight"] = r(nk, d)
        w[p + "attn_v.weight"] = r(nk, d)
        w[p + "attn_output.weight"] = r(d, nq)
        w[p + "ffn_norm.weight"] = 1.0 + r(d, s=0.1)
        w[p + "ffn_gate.weight"] = r(ff, d)
        w[p + "ffn_up.weight"] = r(ff, d)
        w[p + "ffn_down.weight"] = r(d, ff)
    return w


def write_gguf(
    path: str | Path,
    arch: str,
    cfg: dict[str, Any],
    weights: dict[str, np.ndarray],
    ggml_type: GGMLType | str = GGMLType.F32,
    extra_meta: dict[str, Any] | None = None,
) -> Path:
    """Write ``weights`` (2-D+ tensors in ``ggml_type``, 1-D ones in F32) with llama.cpp's metadata keys."""
    t = GGMLType[ggml_type.upper()] if isinstance(ggml_type, str) else GGMLType(ggml_type)
    w = GGUFWriter(path, arch=arch)
    hd = cfg.get("head_dim") or cfg["n_embd"] // cfg["n_head"]
    meta: dict[str, Any] = {
        f"{arch}.context_length": cfg["n_ctx"],
        f"{arch}.embedding_length": cfg["n_embd"],
        f"{arch}.block_count": cfg["n_layer"],
        f"{arch}.feed_forward_length": cfg["n_ff"],
        f"{arch}.attention.head_count": cfg["n_head"],
        f"{arch}.attention.head_count_kv": cfg["n_head_kv"],
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.rope.freq_base": float(cfg["rope_base"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(cfg["eps"]),
        f"{arch}.vocab_size": cfg["n_vocab"],
    }
    meta.update(extra_meta or {})
    from llamapy.gguf import GGUFValueType

    w.add_metadata(meta, int_type=GGUFValueType.UINT32)
    for name, arr in weights.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        tt = t if arr.ndim >= 2 and not name.endswith("_norm.weight") else GGMLType.F32
        if tt not in (GGMLType.F32, GGMLType.F16) and arr.shape[-1] % 32:
            tt = GGMLType.F16
        w.add_tensor(name, arr, ggml_type=tt)
    w.write()
    w.close()
    return Path(path)


def tiny_llama(
    path: str | Path, seed: int = 0, ggml_type: GGMLType | str = GGMLType.F32, **cfg_kw: Any
) -> Path:
    cfg = llama_config(**cfg_kw)
    return write_gguf(path, "llama", cfg, random_llama_weights(cfg, seed), ggml_type)
