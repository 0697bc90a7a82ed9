"""Tiny LoRA adapter files written as llama.cpp's ``convert_lora_to_gguf.py`` writes them, and the
merged weights they stand for (the oracle: a base model with ``W + s B A`` written as a plain file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFValueType
from llamapy.gguf.writer import GGUFWriter


def random_pairs(
    weights: dict[str, np.ndarray], names: list[str], rank: int = 4, seed: int = 0, s: float = 0.3
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(A, B) per base weight, NumPy order: A (rank, n_in), B (n_out, rank); token_embd flipped:
    A (n_vocab, rank), B (n_embd, rank)."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in names:
        n_out, n_in = weights[n].shape
        if n == "token_embd.weight":
            a, b = rng.standard_normal((n_out, rank)), rng.standard_normal((n_in, rank))
        else:
            a, b = rng.standard_normal((rank, n_in)), rng.standard_normal((n_out, rank))
        out[n] = ((a * s).astype(np.float32), (b * s / np.sqrt(rank)).astype(np.float32))
    return out


def write_lora(
    path: str | Path,
    arch: str,
    pairs: dict[str, tuple[np.ndarray, np.ndarray]],
    alpha: float = 0.0,
    ggml_type: GGMLType = GGMLType.F32,
    meta: dict[str, Any] | None = None,
) -> Path:
    w = GGUFWriter(path, arch=arch)
    md: dict[str, Any] = {
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": float(alpha),
    }
    md.update(meta or {})
    for k, v in md.items():
        if v is None:
            continue
        w.add_key_value(k, v, GGUFValueType.FLOAT32) if isinstance(v, float) else w.add_key_value(k, v)
    for name, (a, b) in pairs.items():
        for suffix, arr in (("lora_a", a), ("lora_b", b)):
            t = ggml_type if arr.shape[-1] % 32 == 0 else GGMLType.F32
            w.add_tensor(f"{name}.{suffix}", np.ascontiguousarray(arr), ggml_type=t)
    w.write()
    w.close()
    return Path(path)


def merged(
    weights: dict[str, np.ndarray], pairs: dict[str, tuple[np.ndarray, np.ndarray]], scale: float
) -> dict[str, np.ndarray]:
    """The base weights with each pair merged in at ``scale`` (the effective one, alpha/rank applied)."""
    out = dict(weights)
    for n, (a, b) in pairs.items():
        delta = a @ b.T if n == "token_embd.weight" else b @ a
        out[n] = (weights[n] + scale * delta).astype(np.float32)
    return out
