"""Experts (``mul_mat_id``) on Q4_K weights repacked eight rows at a time: the fused experts kernel of
``moe_kernels`` (every (row group, expert) item of one call in one ``prange``, activations quantized to
Q8_K once per row) with the 8-row arithmetic of ``q4k_x8_kernels`` (the eight lanes of a register are
eight rows of one expert: ``pmaddubsw`` against broadcast activation bytes, one ``pmaddwd`` per
sub-block for the rows' scales).

``R`` is ``uint8[E, N // 8, nb * 1184]``: each expert's rows as ``q4k_x8.repack`` lays out a 2-D weight
(``q4k_x8.repack`` of the 3-D experts). Per expert and activation row the integer sums are the plain
kernel's, and the float steps those of ``mm_q4_k_x8(R[e], ...)`` in the same order: the output equals
that kernel's per expert bit for bit, and the plain ``moe_q4_k`` up to float summation order.

Call: ``moe_q4_k_x8(R, x, ids, out, max_rows) -> bad``, as ``moe_kernels.MOE``'s (``x`` ``float32[T, 1 or
U, K]`` C-contiguous, ``ids`` ``int[T, U]``, ``out`` ``float32[T * U, N]``): experts with more than
``max_rows`` pairs are skipped (the caller runs them as tiles unpacked to plain Q4_K); ``bad`` is -1 or
the first pair whose id is outside ``0..E-1`` (nothing written).
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from .isimd import itof
from .moe_kernels import _nan_pairs, _q8k_par, _xrow, moe_plan
from .q4k_x8_kernels import QK_K, X8_BYTES, X8_D, X8_DMIN, X8_PREFETCH_GROUPS, _x8_block
from .rowgroups import prefetch_bytes
from .simd import vfma, vmul, vsplat, vstore, vzero
from .x8simd import xh8


@njit(parallel=True, cache=True)
def moe_q4_k_x8(R, x, ids, out, max_rows):
    E, G, gb = R.shape
    T, Ux, K = x.shape
    U = ids.shape[1]
    bad, order, starts, active = moe_plan(ids, E, max_rows)
    if bad >= 0:
        return bad
    nb = gb // X8_BYTES
    xq, xd, bs16, bs32, ok = _q8k_par(x.reshape(T * Ux, K))
    nA = active.shape[0]
    n = nA * G
    Rf = R.reshape(-1)
    total = Rf.shape[0]
    for i in prange(n):  # group-major: the threads split every expert's rows evenly
        g, e = i // nA, active[i % nA]
        w = R[e, g]
        nx = i + X8_PREFETCH_GROUPS  # the item this thread runs after the next (static chunks)
        pf = (active[nx % nA] * G + nx // nA) * gb if nx < n else total
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
