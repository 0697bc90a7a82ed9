"""Experts (``mul_mat_id``) of the k-quants in one Numba call: all (expert, group of four rows) work items
of one ``mul_mat_id`` in one ``prange``.

The per-expert loop this replaces (``matmul_steps._mul_mat_id``'s fallback, still used by the other types)
ran a mat-vec kernel per active expert: for one decoded token of Qwen3-30B-A3B that is 8 parallel regions,
8 activation quantizations, 8 NumPy gathers and scatters per ``mul_mat_id``, each on a small matrix
(768x2048 Q4_K, ~0.9 MB), so launch, dispatch and the threads' wait at each region's end weighed as much
as the arithmetic. Here one call:

1. groups the (token, slot) pairs by expert (a counting sort of ``ids``; the first pair with an id
   outside ``0..E-1`` is returned, and the caller raises before anything is computed);
2. quantizes the distinct activation rows to ``Q8_K`` once (``b[T, 1, K]``: one row per token, shared
   by its experts), in parallel over the rows;
3. runs every (row group, expert) item in one ``prange``, group-major, so the two threads split every
   expert's rows evenly however unevenly the tokens chose experts;
4. writes NaN over the outputs of non-finite activation rows, as the one-row kernels do.

The arithmetic per weight row and activation row is the one-row kernels' (``kquant_kernels.matvec_k``
with its row functions, same order), so each output equals ``mm_q4_k(A[e], x, out, f16)`` bit for bit
(the loop's batch kernels, for 2+ rows an expert, round in another order: ~1e-7 relative). Experts
with more than ``max_rows`` pairs are skipped (the caller runs them as dequantized tiles + sgemm).

Call: ``MOE[type](w, x, ids, out, f16, max_rows) -> bad`` with ``w`` ``uint8[E, N, row_bytes]``, ``x``
``float32[T, 1 or U, K]`` (C-contiguous), ``ids`` ``int[T, U]``, ``out`` ``float32[T * U, N]``; ``bad`` is
-1, or the first pair ``t * U + u`` whose id is out of range (nothing written).
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES
from .isimd import iload
from .kquant_kernels import QK_K, _q4k_row, _q5k_row, _q6k_row, q6_bsums, quantize_rows_q8_k
from .layouts import ROWS_PER_PASS
from .rowgroups import PREFETCH_ROWS, prefetch_bytes, rows4, store4
from .simd import vzero


@njit(cache=True)
def moe_plan(ids, E, max_rows):
    """Group the pairs ``p = t * U + u`` by expert: ``order[starts[e]:starts[e + 1]]`` are expert ``e``'s
    pairs, ascending; ``active`` the experts with 1..``max_rows`` pairs. ``bad``: -1 or the first pair
    whose id is out of ``0..E-1``."""
    T, U = ids.shape
    P = T * U
    counts = np.zeros(E + 1, np.int64)
    for t in range(T):
        for u in range(U):
            e = ids[t, u]
            if e < 0 or e >= E:
                return np.int64(t * U + u), counts, counts, counts
            counts[e + 1] += 1
    for e in range(E):
        counts[e + 1] += counts[e]
    starts = counts.copy()
    fill = counts[:E].copy()
    order = np.empty(P, np.int64)
    for t in range(T):
        for u in range(U):
            e = ids[t, u]
            order[fill[e]] = t * U + u
            fill[e] += 1
    n = 0
    for e in range(E):
        c = starts[e + 1] - starts[e]
        if 0 < c <= max_rows:
            n += 1
    active = np.empty(n, np.int64)
    n = 0
    for e in range(E):
        c = starts[e + 1] - starts[e]
        if 0 < c <= max_rows:
            active[n] = e
            n += 1
    return np.int64(-1), order, starts, active


#: at most this many activation rows are quantized on the calling thread (decode: 1 row, or 8 for the
#: ``ffn_down_exps`` of one token, ~1-5 us): one parallel region fewer per call, whose launch and join cost
#: more than the work (and, on a busy machine, wait for a descheduled worker)
Q8K_SERIAL_ROWS = 16


@njit(inline="always")
def _q8k_par(x2):
    """``quantize_rows_q8_k`` over the rows of ``x2``, in parallel past ``Q8K_SERIAL_ROWS`` rows (each
    row on its own: the same bytes either way)."""
    M, K = x2.shape
    xq = np.empty((M, K), np.int8)
    xd = np.empty((M, K // QK_K), np.float32)
    bs16 = np.empty((M, K // 16), np.int32)
    bs32 = np.empty((M, K // 32), np.int32)
    ok = np.empty(M, np.bool_)  # each row's flag set by its quantization (not np.ones: a parallel region)
    if M <= Q8K_SERIAL_ROWS:
        for m in range(M):
            _q8k_row(x2, xq, xd, bs16, bs32, ok, m)
    else:
        for m in prange(M):
            _q8k_row(x2, xq, xd, bs16, bs32, ok, m)
    return xq, xd, bs16, bs32, ok


@njit(inline="always")
def _q8k_row(x2, xq, xd, bs16, bs32, ok, m):
    r = quantize_rows_q8_k(x2[m : m + 1], xq[m : m + 1], xd[m : m + 1], bs16[m : m + 1], bs32[m : m + 1])
    ok[m] = r[0]


@njit(inline="always")
def _xrow(p, U, Ux):
    """The activation row of pair ``p``: its own (``b[T, U, K]``) or its token's (``b[T, 1, K]``)."""
    return p if Ux > 1 else p // U


@njit(inline="always")
def _nan_pairs(out, order, starts, active, U, Ux, ok):
    for i in range(active.shape[0]):
        e = active[i]
        for j in range(starts[e], starts[e + 1]):
            p = order[j]
            if not ok[_xrow(p, U, Ux)]:
                for r in range(out.shape[1]):
                    out[p, r] = np.nan


@njit(inline="always")
def _same(bs16):
    return bs16


# -- the loop: ``kquant_kernels.matvec_k`` over (row group, expert) items, specialized (inlined) per row
# function; ``sums`` makes the row function's per-16 sums from the int32 ones (Q6_K: ``q6_bsums``)
@njit(inline="always")
def moe_k(w, x, ids, out, f16, max_rows, row, bbytes, sums):
    E, N, rb = w.shape
    T, Ux, K = x.shape
    U = ids.shape[1]
    bad, order, starts, active = moe_plan(ids, E, max_rows)
    if bad >= 0:
        return bad
    nb = rb // bbytes
    xq, xd, bs16, bs32, ok = _q8k_par(x.reshape(T * Ux, K))
    b16 = sums(bs16)
    nA = active.shape[0]
    G = (N + 3) // 4
    for i in prange(nA * G):
        g, e = i // nA, active[i % nA]
        we = w[e]
        wf = we.reshape(-1)
        w0, w1, w2, w3 = rows4(we, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for j in range(starts[e], starts[e + 1]):
            p = order[j]
            xr = _xrow(p, U, Ux)
            xqm, b16m, b32m = xq[xr], b16[xr], bs32[xr]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if j == starts[e]:
                    prefetch_bytes(wf, pf + b * ROWS_PER_PASS * bbytes, ROWS_PER_PASS * bbytes, N * rb)
                o, x0, d8 = b * bbytes, b * QK_K, xd[xr, b]
                bsv = iload(b32m, b * 8)
                a0 = row(a0, w0, o, xqm, x0, d8, bsv, b16m, f16)
                a1 = row(a1, w1, o, xqm, x0, d8, bsv, b16m, f16)
                a2 = row(a2, w2, o, xqm, x0, d8, bsv, b16m, f16)
                a3 = row(a3, w3, o, xqm, x0, d8, bsv, b16m, f16)
            store4(out, p, g, N, a0, a1, a2, a3)
    _nan_pairs(out, order, starts, active, U, Ux, ok)
    return np.int64(-1)


@njit(parallel=True, cache=True)
def moe_q4_k(w, x, ids, out, f16, max_rows):
    return moe_k(w, x, ids, out, f16, max_rows, _q4k_row, Q4_K_BYTES, _same)


@njit(parallel=True, cache=True)
def moe_q5_k(w, x, ids, out, f16, max_rows):
    return moe_k(w, x, ids, out, f16, max_rows, _q5k_row, Q5_K_BYTES, _same)


@njit(parallel=True, cache=True)
def moe_q6_k(w, x, ids, out, f16, max_rows):
    return moe_k(w, x, ids, out, f16, max_rows, _q6k_row, Q6_K_BYTES, q6_bsums)


#: type name -> fused experts kernel
MOE = {"Q4_K": moe_q4_k, "Q5_K": moe_q5_k, "Q6_K": moe_q6_k}
