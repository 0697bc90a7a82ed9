"""Numba kernels for the passes over the whole vocabulary (262k tokens must sample in about a millisecond).

- ``top_k_indices``: the k best positions with a size-k heap (one pass, most tokens rejected by one
  comparison), ties broken toward the lower position, like a stable sort.
- ``sort_desc_indices``: a full stable descending sort through one ``uint64`` key sort.
- ``dist_select``: llama.cpp's dist pass: float32 ``exp``, a double running sum, the first index whose
  running sum reaches ``total * rnd``, then probabilities normalized.
- ``softmax_f32``: ``llama_sampler_softmax_impl``'s float32 pass.
- ``sigma_stats``: top-n-sigma's maximum, mean and standard deviation, in llama.cpp's order and types.
"""

from __future__ import annotations

import math

import numpy as np

from llamapy._numba import njit


@njit(cache=True)
def _sift_down(hv, hi, pos, k):
    # min-heap on "worse": a is worse than b if its value is lower, or equal with a higher index
    while True:
        left = 2 * pos + 1
        if left >= k:
            return
        w = left
        right = left + 1
        if right < k and (hv[right] < hv[left] or (hv[right] == hv[left] and hi[right] > hi[left])):
            w = right
        if hv[w] < hv[pos] or (hv[w] == hv[pos] and hi[w] > hi[pos]):
            tv = hv[w]
            hv[w] = hv[pos]
            hv[pos] = tv
            ti = hi[w]
            hi[w] = hi[pos]
            hi[pos] = ti
            pos = w
        else:
            return


@njit(cache=True)
def _top_k_heap(logits, k):
    hv = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    for i in range(k):
        hv[i] = logits[i]
        hi[i] = i
    for pos in range(k // 2 - 1, -1, -1):
        _sift_down(hv, hi, pos, k)
    n = logits.shape[0]
    for i in range(k, n):
        v = logits[i]
        if v > hv[0]:  # an equal value has a higher index than everything kept: worse
            hv[0] = v
            hi[0] = i
            _sift_down(hv, hi, 0, k)
    return hi


def sort_desc_indices(logits: np.ndarray) -> np.ndarray:
    """Positions by descending logit, ties by ascending position (a stable sort, via uint64 keys)."""
    neg = -(logits.astype(np.float32, copy=False) + np.float32(0.0))  # +0 turns -0.0 into 0.0
    b = neg.view(np.uint32)
    ordered = np.where(b & np.uint32(0x80000000), ~b, b | np.uint32(0x80000000)).astype(np.uint64)
    key = (ordered << np.uint64(32)) | np.arange(len(logits), dtype=np.uint64)
    key.sort()
    return (key & np.uint64(0xFFFFFFFF)).astype(np.int64)


def top_k_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest logits in descending order (ties: lower position first)."""
    n = len(logits)
    if k >= n or k * 8 > n:
        return sort_desc_indices(logits)[:k]
    idx = _top_k_heap(logits, k)
    return idx[np.lexsort((idx, -logits[idx]))]


@njit(cache=True)
def dist_select(logits, max_l, rnd, p_out):
    """Returns (selected, total); fills ``p_out`` with normalized probabilities."""
    n = logits.shape[0]
    total = 0.0
    for i in range(n):
        v = np.float32(math.exp(logits[i] - max_l))
        p_out[i] = v
        total += v
    tgt = total * rnd
    run = 0.0
    sel = -1
    for i in range(n):
        run += p_out[i]
        if run >= tgt:
            sel = i
            break
    if total > 0.0:
        for i in range(n):
            p_out[i] = np.float32(p_out[i] / total)
    return sel, total


@njit(cache=True)
def softmax_f32(logits, max_l, p_out):
    n = logits.shape[0]
    s = np.float32(0.0)
    for i in range(n):
        v = np.float32(math.exp(logits[i] - max_l))
        p_out[i] = v
        s += v
    for i in range(n):
        p_out[i] = p_out[i] / s


@njit(cache=True)
def _mass_candidates(logits, p, target, n_buckets):
    """Positions of the highest logits whose probabilities (``p``) sum to at least ``target``, found by a
    histogram of the logits: every token in a bucket at or above the crossing bucket (unsorted)."""
    n = logits.shape[0]
    lo = np.inf
    hi = -np.inf
    for i in range(n):
        v = logits[i]
        if v > -np.inf:
            if v < lo:
                lo = v
            if v > hi:
                hi = v
    if not hi > lo:
        return np.arange(n)
    scale = (n_buckets - 1) / (np.float64(hi) - np.float64(lo))
    mass = np.zeros(n_buckets, dtype=np.float64)
    bucket = np.empty(n, dtype=np.int32)
    for i in range(n):
        v = logits[i]
        b = 0
        if v > -np.inf:
            b = int((np.float64(v) - lo) * scale)
        bucket[i] = b
        mass[b] += p[i]
    cum = 0.0
    cut = 0
    for b in range(n_buckets - 1, -1, -1):
        cum += mass[b]
        if cum >= target:
            cut = b
            break
    count = 0
    for i in range(n):
        if bucket[i] >= cut:
            count += 1
    out = np.empty(count, dtype=np.int64)
    j = 0
    for i in range(n):
        if bucket[i] >= cut:
            out[j] = i
            j += 1
    return out


def mass_candidates(logits: np.ndarray, p: np.ndarray, target: float) -> np.ndarray:
    """Positions (descending logit, stable) of a prefix of the sorted order whose mass reaches ``target``
    (plus its bucket's ties); the caller checks the exact running sum and falls back to a full sort."""
    idx = _mass_candidates(logits, p, float(target), 4096)
    return idx[sort_desc_indices(logits[idx])]


@njit(cache=True)
def sigma_stats(logits):
    """(max, mean, std) of the finite logits as llama.cpp's top-n-sigma computes them: a running float
    sum for the mean, each squared deviation added as a double and the sum rounded back to float."""
    mx = logits[0]
    total = np.float32(0.0)
    n = 0
    for v in logits:
        if v != -np.inf:
            mx = max(mx, v)
            total = np.float32(total + v)
            n += 1
    if n == 0:
        return mx, np.float32(0.0), np.float32(0.0)
    mean = np.float32(total / np.float32(n))
    acc = np.float32(0.0)
    for v in logits:
        if v != -np.inf:
            d = np.float64(np.float32(v - mean))
            acc = np.float32(np.float64(acc) + d * d)
    return mx, mean, np.float32(math.sqrt(np.float32(acc / np.float32(n))))
