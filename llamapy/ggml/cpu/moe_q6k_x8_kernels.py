"""Experts (``mul_mat_id``) on Q6_K weights repacked eight rows at a time: ``moe_x8_kernels``' fused experts
kernel (every (row group, expert) item of one call in one ``prange``, chunk-major, activations quantized to
Q8_K once per row) with the 8-row arithmetic of ``q6k_x8_kernels`` (``_x8_block``: the eight lanes of a
register are eight rows of one expert).

``R`` is ``uint8[E, N // 8, nb * 1680]``: each expert's rows as ``q6k_x8_kernels.repack_x8`` lays out a 2-D
weight. Per expert and activation row the integer sums and the float steps (without fast-math flags) are
those of ``mm_q6_k_x8(R[e], ...)``: the output equals that kernel's per expert bit for bit, and the plain
``moe_kernels.moe_q6_k`` up to float summation order.

An expert's pairs run four at a time where it has two or more (``q6k_x8_kernels._sub4``, as
``mm_q6_k_x8r4``: each code register decoded once for all four; a group of 2 or 3 repeats its last pair),
the last single one alone; the float steps are the same either way, so a pair's result does not depend on
the others. Where each active expert has one pair (decode), ``moe_x8_kernels.moe_x8_rows`` reads the items
as two streams a thread, with the dense kernel's block.

Call: ``moe_q6_k_x8(R, x, ids, out, max_rows, chunks, pfd) -> bad``, as ``moe_x8_kernels.moe_q4_k_x8``.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from .isimd import itof, izero
from .moe_kernels import _nan_pairs, _xrow, moe_plan
from .moe_x8_kernels import _item, _prefetch_from, moe_x8_rows, one_pair_each
from .q6k_x8_kernels import (
    QK_K,
    X8_BYTES,
    X8_D,
    X8_Q,
    X8_SC,
    _prepare,
    _sub4,
    _x6scale,
    _x8_block,
    _x8_row_block,
)
from .rowgroups import x8_prefetch
from .simd import vfma_strict, vmul_strict, vsplat, vstore, vzero
from .x8simd import xh8


@njit(parallel=True, cache=True)
def moe_q6_k_x8(R, x, ids, out, max_rows, chunks, pfd):
    E, G, gb = R.shape
    T, Ux, K = x.shape
    U = ids.shape[1]
    bad, order, starts, active = moe_plan(ids, E, max_rows)
    if bad >= 0:
        return bad
    nb = gb // X8_BYTES
    xq, xd, neg, ok = _prepare(x.reshape(T * Ux, K))
    if chunks > 0 and one_pair_each(starts, active):  # decode: two streams a thread (``moe_x8_rows``)
        moe_x8_rows(R, out, order, starts, active, U, Ux, chunks, pfd, X8_BYTES, _x8_row_block, (xq, xd, neg))
        _nan_pairs(out, order, starts, active, U, Ux, ok)
        return np.int64(-1)
    nA = active.shape[0]
    C = max(1, min(abs(chunks), G))
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
        pf = _prefetch_from(i, n, nA, Gc, G, active, e, g, gb, total, pfd)
        j0, j1 = starts[e], starts[e + 1]
        j = j0
        while j + 1 < j1:  # 2-4 pairs at a time (``_sub4``: each code register decoded once for all)
            pa, pb = order[j], order[j + 1]
            pc, pd = order[min(j + 2, j1 - 1)], order[min(j + 3, j1 - 1)]  # past the end: repeats
            ra, rb_, rc, rd = _xrow(pa, U, Ux), _xrow(pb, U, Ux), _xrow(pc, U, Ux), _xrow(pd, U, Ux)
            x0, x1, x2, x3 = xq[ra], xq[rb_], xq[rc], xq[rd]
            n0, n1, n2, n3 = neg[ra], neg[rb_], neg[rc], neg[rd]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if j == j0:
                    x8_prefetch(Rf, pf + t, X8_BYTES, total, pfd)
                i0, i1, i2, i3 = izero(), izero(), izero(), izero()
                for q in range(8):
                    s, c, xo, j2 = t + X8_Q + 192 * q, t + X8_SC + 16 * q, b * QK_K + 32 * q, b * 32 + 4 * q
                    sc = _x6scale(w, c, 0)
                    i0, i1, i2, i3 = _sub4(i0, i1, i2, i3, w, s, x0, x1, x2, x3, xo, n0, n1, n2, n3, j2, sc)
                    sc = _x6scale(w, c, 1)
                    i0, i1, i2, i3 = _sub4(
                        i0, i1, i2, i3, w, s + 96, x0, x1, x2, x3, xo + 16, n0, n1, n2, n3, j2 + 2, sc
                    )
                d = xh8(w, t + X8_D)
                a0 = vfma_strict(a0, vmul_strict(d, vsplat(xd[ra, b])), itof(i0))
                a1 = vfma_strict(a1, vmul_strict(d, vsplat(xd[rb_, b])), itof(i1))
                a2 = vfma_strict(a2, vmul_strict(d, vsplat(xd[rc, b])), itof(i2))
                a3 = vfma_strict(a3, vmul_strict(d, vsplat(xd[rd, b])), itof(i3))
            vstore(out[pd], g * 8, a3)  # repeats written again with the same values
            vstore(out[pc], g * 8, a2)
            vstore(out[pb], g * 8, a1)
            vstore(out[pa], g * 8, a0)
            j += 4
        if j < j1:  # one pair left
            p = order[j]
            xr = _xrow(p, U, Ux)
            xqm, negm = xq[xr], neg[xr]
            acc = vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if j == j0:
                    x8_prefetch(Rf, pf + t, X8_BYTES, total, pfd)
                isum = _x8_block(w, t, xqm, b * QK_K, negm)
                acc = vfma_strict(acc, vmul_strict(xh8(w, t + X8_D), vsplat(xd[xr, b])), itof(isum))
            vstore(out[p], g * 8, acc)
    _nan_pairs(out, order, starts, active, U, Ux, ok)
    return np.int64(-1)
