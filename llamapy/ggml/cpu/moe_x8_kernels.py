"""Experts (``mul_mat_id``) on Q4_K weights repacked eight rows at a time: the fused experts kernel of
``moe_kernels`` (every (row group, expert) item of one call in one ``prange``, activations quantized to
Q8_K once per row) with the 8-row arithmetic of ``q4k_x8_kernels`` (the eight lanes of a register are
eight rows of one expert: ``pmaddubsw`` against broadcast activation bytes, one ``pmaddwd`` per
sub-block for the rows' scales).

``R`` is ``uint8[E, N // 8, nb * 1184]``: each expert's rows as ``q4k_x8.repack`` lays out a 2-D weight
(``q4k_x8.repack`` of the 3-D experts). Per expert and activation row the integer sums are the plain
kernel's, and the float steps those of ``mm_q4_k_x8(R[e], ...)`` in the same order: the output equals
that kernel's per expert bit for bit, and the plain ``moe_q4_k`` up to float summation order.

Call: ``moe_q4_k_x8(R, x, ids, out, max_rows, chunks) -> bad``, as ``moe_kernels.MOE``'s (``x``
``float32[T, 1 or U, K]`` C-contiguous, ``ids`` ``int[T, U]``, ``out`` ``float32[T * U, N]``; ``chunks``:
the thread count, ``numba.get_num_threads()``, see ``_item``): experts with more than
``max_rows`` pairs are skipped (the caller runs them as tiles unpacked to plain Q4_K); ``bad`` is -1 or
the first pair whose id is outside ``0..E-1`` (nothing written).
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from .isimd import itof
from .moe_kernels import _nan_pairs, _q8k_par, _xrow, moe_plan
from .q4k_x8_kernels import QK_K, X8_BYTES, X8_D, X8_DMIN, X8_PREFETCH_GROUPS, _x8_block, repack_x8
from .rowgroups import prefetch_bytes
from .simd import vfma, vmul, vsplat, vstore, vzero
from .x8simd import xh8


@njit(inline="always")
def _item(i, nA, Gc, G):
    """Work item ``i`` -> (index into ``active``, row group; -1 past the last group): chunk-major, so
    that with ``C`` chunks of ``Gc`` groups (C: the thread count) each thread's equal share of the
    ``prange`` is one chunk of every expert (balanced however unevenly the tokens chose experts) and
    within it an expert's groups are consecutive (one stream, as the dense kernel reads)."""
    c, r = i // (nA * Gc), i % (nA * Gc)
    g = c * Gc + r % Gc
    return r // Gc, g if g < G else -1


@njit(parallel=True, cache=True)
def moe_q4_k_x8(R, x, ids, out, max_rows, chunks):
    E, G, gb = R.shape
    T, Ux, K = x.shape
    U = ids.shape[1]
    bad, order, starts, active = moe_plan(ids, E, max_rows)
    if bad >= 0:
        return bad
    nb = gb // X8_BYTES
    xq, xd, bs16, bs32, ok = _q8k_par(x.reshape(T * Ux, K))
    nA = active.shape[0]
    C = max(1, min(chunks, G))
    Gc = (G + C - 1) // C
    n = C * nA * Gc
    Rf = R.reshape(-1)
    total = Rf.shape[0]
    for i in prange(n):
        a, g = _item(i, nA, Gc, G)
        if g < 0:
            continue
        e = active[a]
        w = R[e, g]
        pf = total  # the item this thread runs after the next: prefetched into L2 (an expert's start)
        if i + X8_PREFETCH_GROUPS < n:
            a2, g2 = _item(i + X8_PREFETCH_GROUPS, nA, Gc, G)
            if g2 >= 0:
                pf = (active[a2] * G + g2) * gb
        for j in range(starts[e], starts[e + 1]):
            p = order[j]
            xr = _xrow(p, U, Ux)
            xqm, b32m = xq[xr], bs32[xr]
            acc = vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if j == starts[e]:
                    prefetch_bytes(Rf, pf + t, X8_BYTES, total)
                isum, msum = _x8_block(w, t, xqm, b * QK_K, b32m, b * 8)
                acc = vfma(acc, vmul(xh8(w, t + X8_D), vsplat(xd[xr, b])), itof(isum))
                acc = vfma(acc, vmul(xh8(w, t + X8_DMIN), vsplat(-xd[xr, b])), itof(msum))
            vstore(out[p], g * 8, acc)
    _nan_pairs(out, order, starts, active, U, Ux, ok)
    return np.int64(-1)


@njit(cache=True)
def repack_experts(A, R, done, ids, new):
    """Repack (``repack_x8``) the experts ``ids`` names that are not ``done`` yet (ids out of range are
    skipped: the kernel reports them), mark them done and list them in ``new``; returns their count."""
    E = A.shape[0]
    T, U = ids.shape
    n = 0
    for t in range(T):
        for u in range(U):
            e = ids[t, u]
            if 0 <= e < E and done[e] == 0:
                repack_x8(A[e], R[e])
                done[e] = 1
                new[n] = e
                n += 1
    return n
