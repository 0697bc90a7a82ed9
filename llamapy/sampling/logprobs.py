"""Log-probabilities reported to users: those of the raw logits (as llama.cpp's server reports them),
one implementation for the API, the server and the CLI."""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log(softmax(logits))`` along the last axis, computed in float64, returned as float32."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return (x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))).astype(np.float32)


def top_logprobs(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens as (id, logprob), most likely first (ties: lower id first)."""
    if n <= 0:
        return []
    n = min(n, logprobs.size)
    idx = np.argpartition(-logprobs, n - 1)[:n]
    idx = idx[np.lexsort((idx, -logprobs[idx]))]
    return [(int(i), float(logprobs[i])) for i in idx]
