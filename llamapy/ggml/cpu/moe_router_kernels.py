"""A small float32 weight times a few activation rows on the calling thread: the MoE router (Qwen3-30B-A3B's
``ffn_gate_inp``, 128x2048 float32, 1 MB a layer) of a decoded token.

``matmul_steps`` ran these as one sgemm on the calling thread (OpenBLAS: packing for a 1-row product,
no prefetch); from memory (the previous layer's experts evict the router) that read 5.7 GB per CPU-second:
0.17-0.20 CPU ms a call, ~1.1 ms of a Qwen3-30B-A3B-shaped token (6 layers). Here: each weight row read
once for all activation rows, four 8-lane accumulators, the rows two ahead prefetched into L2: 0.06-0.08
CPU ms a call (``benchmarks/results/moe_router.md``). Serial (no parallel region: a launch costs more
than the product, and on a busy machine a descheduled worker stalls it), so the bits do not depend on the
thread count.

``mm_id_f32_small``: ``mul_mat_id`` of small float32 experts for a few tokens, the pairs one after the
other in one call: the router's one-hot gather of the chosen experts' probabilities (``eye[128, 1, 128]``,
8 pairs). ``np.matmul`` on the gathered experts took 80-150 us a call there in a decode (NumPy's
calls after the experts' kernels have streamed the caches), this 2-5 us; a one-hot product is exact in
any summation order, so the result is the same bits.

Call: ``mv_f32_small(w, x, out)`` with ``w`` ``float32[N, K]`` C-contiguous, ``x`` ``float32[M, K]`` and
``out`` ``float32[M, N]``, each with unit stride along its rows. ``mv_f32_small_ref``: the same sums
written without intrinsics (same order of the lanes, tests)."""

from __future__ import annotations

import os

import numpy as np

from ..._numba import njit
from .simd import prefetch, vfma, vhsum, vload, vzero

__all__ = [
    "ENABLED",
    "ID_MAX_FLOATS",
    "mm_id_f32_small",
    "mv_f32_small",
    "mv_f32_small_ref",
    "route_softmax_topk",
    "usable",
    "usable_id",
    "weighted_sum",
]

#: run ``mv_f32_small`` for the small float32 products (``LLAMAPY_F32_SMALL_MV=0``: the sgemm as before)
ENABLED = os.environ.get("LLAMAPY_F32_SMALL_MV", "1") not in ("0", "false", "no", "off")
#: weight rows prefetched ahead of the one being read
PREFETCH_ROWS = 2


def usable(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``mv_f32_small`` takes these arrays (float32, unit stride along the rows, ``w``
    C-contiguous) and is switched on."""
    return (
        ENABLED
        and w.dtype == x.dtype == out.dtype == np.float32
        and w.ndim == x.ndim == out.ndim == 2
        and w.flags.c_contiguous
        and x.strides[1] == 4
        and out.strides[1] == 4
        and x.shape[1] == w.shape[1]
        and out.shape == (x.shape[0], w.shape[0])
    )


@njit(cache=True)
def mv_f32_small(w, x, out):
    """``out = x @ w.T``: per weight row, every activation row against it in four 8-lane accumulators
    (lanes of ``k % 32``), summed ``(a0 + a1) + (a2 + a3)`` lane-wise then across, then the tail."""
    N, K = w.shape
    M = x.shape[0]
    wf = w.reshape(-1)
    total = N * K
    K32 = K - K % 32
    for n in range(N):
        p = (n + PREFETCH_ROWS) * K
        if p + K <= total:
            for c in range(0, K, 16):
                prefetch(wf, p + c)
        wn = w[n]
        for m in range(M):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for k in range(0, K32, 32):
                a0 = vfma(a0, vload(wn, k), vload(xm, k))
                a1 = vfma(a1, vload(wn, k + 8), vload(xm, k + 8))
                a2 = vfma(a2, vload(wn, k + 16), vload(xm, k + 16))
                a3 = vfma(a3, vload(wn, k + 24), vload(xm, k + 24))
            s = vhsum(a0) + vhsum(a1) + vhsum(a2) + vhsum(a3)
            for k in range(K32, K):
                s += wn[k] * xm[k]
            out[m, n] = s


def mv_f32_small_ref(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``mv_f32_small`` in NumPy (float32 throughout, the kernel's accumulators as lanes; rounding may
    differ from it in the last bits where LLVM fuses or reorders its fast-math sums)."""
    N, K = w.shape
    K32 = K - K % 32
    for m in range(x.shape[0]):
        prod = (w[:, :K32] * x[m, :K32]).reshape(N, K32 // 32, 4, 8)
        acc = prod.sum(axis=1, dtype=np.float32)  # [N, 4, 8]
        s = acc.sum(axis=2, dtype=np.float32).sum(axis=1, dtype=np.float32)
        if K32 < K:
            s = s + (w[:, K32:] * x[m, K32:]).sum(axis=1, dtype=np.float32)
        out[m] = s


#: ``mm_id_f32_small`` takes experts of at most this many floats each (``N * K``; the one-hot router
#: gather: 128)
ID_MAX_FLOATS = 1 << 14


def usable_id(a: np.ndarray, x: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``mm_id_f32_small`` takes experts ``a`` (``float32[E, N, K]``, C-contiguous, at most
    ``ID_MAX_FLOATS`` each), activations ``x`` (``float32[T, 1 or U, K]``) and ``out``
    (``float32[T * U, N]``), and is switched on."""
    return (
        ENABLED
        and a.dtype == x.dtype == out.dtype == np.float32
        and a.ndim == x.ndim == 3
        and out.ndim == 2
        and a.flags.c_contiguous
        and a.shape[1] * a.shape[2] <= ID_MAX_FLOATS
        and x.shape[2] == a.shape[2]
        and out.shape[1] == a.shape[1]
    )


@njit(cache=True)
def mm_id_f32_small(a, x, ids, out):
    """``out[t * U + u] = a[ids[t, u]] @ x[t, u or 0]`` (each dot product in order of ``k``); returns -1,
    or the first pair whose id is outside ``0..E-1`` (nothing written)."""
    E, N, K = a.shape
    T, U = ids.shape
    Ux = x.shape[1]
    for t in range(T):
        for u in range(U):
            if ids[t, u] < 0 or ids[t, u] >= E:
                return np.int64(t * U + u)
    for t in range(T):
        for u in range(U):
            ae = a[ids[t, u]]
            xr = x[t, u if Ux > 1 else 0]
            for n in range(N):
                s = np.float32(0.0)
                for k in range(K):
                    s += ae[n, k] * xr[k]
                out[t * U + u, n] = s
    return np.int64(-1)


@njit(cache=True)
def route_softmax_topk(logits, scale, onehot, k, norm, ids, w):
    """The router of a softmax-gated MoE for each row of ``logits`` (``float32[T, E]``): probabilities
    ``p = softmax(logits * scale)`` (the product in float32 as ``soft_max``'s step, the exponentials and
    their sum in float64, ``p`` rounded to float32 once), the ``k`` largest first into ``ids[t]``
    (``int32``; ties: the lower expert, as a stable sort of ``-p``; NaN last), their gathered weights
    ``w[t, j] = onehot[ids[t, j], 0] @ p`` (``mul_mat_id`` with the one-hot experts: a float32 sum in
    order of the experts, exact for the identity) and, where ``norm``, ``w[t] / sum(w[t])`` (the sum in
    float64 rounded to float32, then a float32 division: ``sum_rows`` + ``div``). Each row of ``logits``
    is read whole before ``ids[t]`` / ``w[t]`` are written."""
    T, E = logits.shape
    p = np.empty(E, np.float32)
    ex = np.empty(E, np.float64)
    taken = np.zeros(E, np.bool_)
    g = np.empty(k, np.float32)
    for t in range(T):
        m = -np.inf
        for e in range(E):
            v = np.float64(logits[t, e] * scale)
            ex[e] = v
            if v > m:
                m = v
        s = 0.0
        for e in range(E):
            ex[e] = np.exp(ex[e] - m)
            s += ex[e]
        for e in range(E):
            p[e] = np.float32(ex[e] / s)
            taken[e] = False
        for j in range(k):
            best = -1
            for e in range(E):
                if taken[e]:
                    continue
                if best < 0 or p[e] > p[best] or (p[best] != p[best] and p[e] == p[e]):
                    best = e
            taken[best] = True
            ids[t, j] = best
            row = onehot[best, 0]
            acc = np.float32(0.0)
            for e in range(E):
                acc += row[e] * p[e]
            g[j] = acc
        if norm:
            s2 = 0.0
            for j in range(k):
                s2 += np.float64(g[j])
            d = np.float32(s2)
            for j in range(k):
                w[t, j] = g[j] / d
        else:
            for j in range(k):
                w[t, j] = g[j]


@njit(cache=True)
def weighted_sum(y, w, out):
    """``out[t] = sum_j y[t, j] * w[t, j]`` (``y`` ``float32[T, U, N]``, ``w`` ``float32[T, U]``): each
    product rounded to float32 (the ``mul`` step), the sum over ``j`` in float64 rounded once (the
    ``sum_rows`` step); row ``t`` of ``y`` is read whole before ``out[t]`` is written."""
    T, U, N = y.shape
    acc = np.empty(N, np.float64)
    for t in range(T):
        acc[:] = 0.0
        for j in range(U):
            wj = w[t, j]
            yj = y[t, j]
            for c in range(N):
                acc[c] += np.float64(yj[c] * wj)
        for c in range(N):
            out[t, c] = np.float32(acc[c])
