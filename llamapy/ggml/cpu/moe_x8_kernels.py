"""Experts (``mul_mat_id``) on Q4_K weights repacked eight rows at a time: the fused experts kernel of
``moe_kernels`` (every (row group, expert) item of one call in one ``prange``, activations quantized to
Q8_K once per row) with the 8-row arithmetic of ``q4k_x8_kernels`` (the eight lanes of a register are
eight rows of one expert: ``pmaddubsw`` against broadcast activation bytes, one ``pmaddwd`` per
sub-block for the rows' scales).

``R`` is ``uint8[E, N // 8, nb * 1184]``: each expert's rows as ``q4k_x8.repack`` lays out a 2-D weight
(``q4k_x8.repack`` of the 3-D experts). Per expert and activation row the integer sums are the plain
kernel's, and the float steps those of ``mm_q4_k_x8(R[e], ...)`` in the same order: the output equals
that kernel's per expert bit for bit, and the plain ``moe_q4_k`` up to float summation order.

An expert's pairs run four at a time (then two, then one: ``_x8_block4`` / ``_x8_block2``): each 32
weight bytes are unpacked to nibbles once for all of them while the group's 8 rows sit in L1; with ~4 pairs
an expert (pp64 on Qwen3-30B-A3B: 512 pairs over 128 experts) that is 0.8-0.9x the CPU time of one pair at
a time (``benchmarks/results/moe_x8.md``). Per pair the integer sums and the float steps are the same
whichever way it is grouped (``moe_q4_k_x8_1``, one pair at a time, gives the same bits: a token's result
does not depend on which other tokens chose its experts). Where each active expert has one pair (decode),
``moe_x8_rows`` reads the (expert, group) items as two streams a thread with the dense kernel's block
(``moe_q4_k_x8_1`` keeps the loop of one item at a time: tests and A/B).

Call: ``moe_q4_k_x8(R, x, ids, out, max_rows, chunks, pfd) -> bad``, as ``moe_kernels.MOE``'s (``x``
``float32[T, 1 or U, K]`` C-contiguous, ``ids`` ``int[T, U]``, ``out`` ``float32[T * U, N]``; ``chunks``:
the thread count, ``numba.get_num_threads()``, see ``_item``; negative: that count, one item after the
other in decode too, not ``moe_x8_rows``' two streams, which ``prefetch_tune`` measures against): experts
with more than ``max_rows`` pairs are skipped (the caller runs them as tiles unpacked to plain Q4_K); ``bad`` is -1 or
the first pair whose id is outside ``0..E-1`` (nothing written); ``pfd``: the prefetch distance in
bytes (``_prefetch_from``, ``prefetch_tune``).
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from .isimd import bnib, itof, izero
from .moe_kernels import _nan_pairs, _q8k_par, _xrow, moe_plan
from .q4k_x8_kernels import QK_K, X8_BYTES, X8_D, X8_DMIN, X8_MN, X8_QS, X8_SC, _x8_block, _x8_row_block
from .rowgroups import X8_PREFETCH_GROUPS, x8_group_prefetch, x8_prefetch, x8_prefetch_from
from .simd import vfma, vmul, vsplat, vstore, vzero
from .x8simd import xadd16, xbcast4, xh8, xmaddubs, xmins, xscale, xzero16


@njit(inline="always")
def _x8_block2(w, t, xa, xb, x0, ba, bb_, bo):
    """``_x8_block`` for two activation rows ``xa``, ``xb`` (their 32-bit sums ``ba``, ``bb_``) at once:
    each 32 weight bytes unpacked to nibbles once for both; the same integer sums per row."""
    ia, ib = izero(), izero()
    for c in range(4):
        la, ha, lb, hb = xzero16(), xzero16(), xzero16(), xzero16()
        for g in range(8):
            q = t + X8_QS + 256 * c + 32 * g
            lo, hi = bnib(w, q, False), bnib(w, q, True)
            o = x0 + 64 * c + 4 * g
            la = xadd16(la, xmaddubs(lo, xbcast4(xa, o)))
            lb = xadd16(lb, xmaddubs(lo, xbcast4(xb, o)))
            ha = xadd16(ha, xmaddubs(hi, xbcast4(xa, o + 32)))
            hb = xadd16(hb, xmaddubs(hi, xbcast4(xb, o + 32)))
        ia = xscale(ia, la, w, t + X8_SC + 16 * c)
        ia = xscale(ia, ha, w, t + X8_SC + 16 * c + 8)
        ib = xscale(ib, lb, w, t + X8_SC + 16 * c)
        ib = xscale(ib, hb, w, t + X8_SC + 16 * c + 8)
    ma, mb = izero(), izero()
    for p in range(4):
        k = bo + 2 * p
        ma = xmins(ma, w, t + X8_MN + 16 * p, np.int32((ba[k] & 0xFFFF) | (ba[k + 1] << 16)))
        mb = xmins(mb, w, t + X8_MN + 16 * p, np.int32((bb_[k] & 0xFFFF) | (bb_[k + 1] << 16)))
    return ia, ma, ib, mb


@njit(inline="always")
def _x8_block4(w, t, xa, xb, xc, xe, x0):
    """The scaled quant sums of ``_x8_block`` for four activation rows at once (mins: ``_x8_mins``)."""
    ia, ib, ic, ie = izero(), izero(), izero(), izero()
    for c in range(4):
        for h in range(2):
            sa, sb, sc, se = xzero16(), xzero16(), xzero16(), xzero16()
            for g in range(8):
                q = t + X8_QS + 256 * c + 32 * g
                v = bnib(w, q, h == 1)
                o = x0 + 64 * c + 32 * h + 4 * g
                sa = xadd16(sa, xmaddubs(v, xbcast4(xa, o)))
                sb = xadd16(sb, xmaddubs(v, xbcast4(xb, o)))
                sc = xadd16(sc, xmaddubs(v, xbcast4(xc, o)))
                se = xadd16(se, xmaddubs(v, xbcast4(xe, o)))
            k = t + X8_SC + 16 * c + 8 * h
            ia, ib, ic, ie = (
                xscale(ia, sa, w, k),
                xscale(ib, sb, w, k),
                xscale(ic, sc, w, k),
                xscale(ie, se, w, k),
            )
    return ia, ib, ic, ie


@njit(inline="always")
def _x8_mins(w, t, b32, bo):
    m = izero()
    for p in range(4):
        k = bo + 2 * p
        m = xmins(m, w, t + X8_MN + 16 * p, np.int32((b32[k] & 0xFFFF) | (b32[k + 1] << 16)))
    return m


@njit(inline="always")
def _item(i, nA, Gc, G):
    """Work item ``i`` -> (index into ``active``, row group; -1 past the last group): chunk-major, so
    that with ``C`` chunks of ``Gc`` groups (C: the thread count) each thread's equal share of the
    ``prange`` is one chunk of every expert (balanced however unevenly the tokens chose experts) and
    within it an expert's groups are consecutive (one stream, as the dense kernel reads)."""
    c, r = i // (nA * Gc), i % (nA * Gc)
    g = c * Gc + r % Gc
    return r // Gc, g if g < G else -1


@njit(inline="always")
def _prefetch_from(i, n, nA, Gc, G, active, e, g, gb, total, pfd):
    """The flat weight offset that work item ``i`` (expert ``e``, group ``g``) prefetches from while it
    reads its first pairs: ``|pfd|`` bytes past its own group's start where ``pfd`` is not 0 (a stream, as
    the dense kernels: an expert's groups are consecutive; negative: into L1, ``rowgroups.x8_prefetch``),
    else the group of the item this thread runs ``X8_PREFETCH_GROUPS`` after this one (``total``: none)."""
    if pfd != 0:
        return x8_prefetch_from(e * G + g, gb, pfd)
    pf = total
    if i + X8_PREFETCH_GROUPS < n:
        a2, g2 = _item(i + X8_PREFETCH_GROUPS, nA, Gc, G)
        if g2 >= 0:
            pf = (active[a2] * G + g2) * gb
    return pf


@njit(inline="always")
def one_pair_each(starts, active):
    """Whether every active expert has exactly one pair (a decode token's experts): ``moe_x8_rows``."""
    for a in range(active.shape[0]):
        e = active[a]
        if starts[e + 1] - starts[e] != 1:
            return False
    return True


@njit(inline="always")
def moe_x8_rows(R, out, order, starts, active, U, Ux, chunks, pfd, xbytes, blk, a):
    """The experts' loop where each active expert has one pair (``one_pair_each``: decode), as
    ``rowgroups.x8_rows`` reads a dense weight: each of ``chunks`` parts (``prange``; the thread count)
    takes the same range of row groups of every active expert, and reads its items (expert, group) as two
    streams, the first and second halves of its list together, block by block. ``blk`` is the dense
    8-row kernel's block (``x8_rows``' ``blk``, ``m``: the pair's activation row), so a pair's output is
    that kernel's per expert bit for bit; ``a`` its prepared activations. On the Intel VM the dense
    kernels read 5-30 % faster this way than one group after the other
    (``benchmarks/results/stop56_decode_steps.md``); one stream an item at a time is the other loop's."""
    E, G, gb = R.shape
    nb = gb // xbytes
    Rf = R.reshape(-1)
    total = Rf.shape[0]
    nA = active.shape[0]
    parts = max(1, min(chunks, G))
    for th in prange(parts):
        lo = th * G // parts
        ng = (th + 1) * G // parts - lo
        n = nA * ng
        h = n // 2
        for i in range(h + (n & 1)):
            k0 = i if i < h else n - 1  # an odd item left runs as both streams (the same bits twice)
            k1 = i + h if i < h else n - 1
            e0, g0 = active[k0 // ng], lo + k0 % ng
            e1, g1 = active[k1 // ng], lo + k1 % ng
            p0, p1 = order[starts[e0]], order[starts[e1]]
            m0, m1 = _xrow(p0, U, Ux), _xrow(p1, U, Ux)
            w0, w1 = R[e0, g0], R[e1, g1]
            a0, a1 = vzero(), vzero()
            for b in range(nb):
                t = b * xbytes
                x8_group_prefetch(Rf, e0 * G + g0, gb, t, xbytes, total, pfd)
                x8_group_prefetch(Rf, e1 * G + g1, gb, t, xbytes, total, pfd)
                a0 = blk(a0, w0, t, m0, b, a)
                a1 = blk(a1, w1, t, m1, b, a)
            vstore(out[p0], g0 * 8, a0)
            vstore(out[p1], g1 * 8, a1)


@njit(inline="always")
def _moe_x8(R, x, ids, out, max_rows, chunks, pfd, group):
    E, G, gb = R.shape
    T, Ux, K = x.shape
    U = ids.shape[1]
    bad, order, starts, active = moe_plan(ids, E, max_rows)
    if bad >= 0:
        return bad
    nb = gb // X8_BYTES
    xq, xd, bs16, bs32, ok = _q8k_par(x.reshape(T * Ux, K))
    if chunks > 0 and group >= 4 and one_pair_each(starts, active):
        moe_x8_rows(
            R, out, order, starts, active, U, Ux, chunks, pfd, X8_BYTES, _x8_row_block, (xq, xd, bs32)
        )
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
        while j + 3 < j1 and group >= 4:  # four pairs at a time
            pa, pb, pc, pe = order[j], order[j + 1], order[j + 2], order[j + 3]
            ra, rb_, rc, re = _xrow(pa, U, Ux), _xrow(pb, U, Ux), _xrow(pc, U, Ux), _xrow(pe, U, Ux)
            aa, ab, ac, ae = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if j == j0:
                    x8_prefetch(Rf, pf + t, X8_BYTES, total, pfd)
                ia, ib, ic, ie = _x8_block4(w, t, xq[ra], xq[rb_], xq[rc], xq[re], b * QK_K)
                ma, mb = _x8_mins(w, t, bs32[ra], b * 8), _x8_mins(w, t, bs32[rb_], b * 8)
                mc, me = _x8_mins(w, t, bs32[rc], b * 8), _x8_mins(w, t, bs32[re], b * 8)
                dh, mh = xh8(w, t + X8_D), xh8(w, t + X8_DMIN)
                aa = vfma(aa, vmul(dh, vsplat(xd[ra, b])), itof(ia))
                aa = vfma(aa, vmul(mh, vsplat(-xd[ra, b])), itof(ma))
                ab = vfma(ab, vmul(dh, vsplat(xd[rb_, b])), itof(ib))
                ab = vfma(ab, vmul(mh, vsplat(-xd[rb_, b])), itof(mb))
                ac = vfma(ac, vmul(dh, vsplat(xd[rc, b])), itof(ic))
                ac = vfma(ac, vmul(mh, vsplat(-xd[rc, b])), itof(mc))
                ae = vfma(ae, vmul(dh, vsplat(xd[re, b])), itof(ie))
                ae = vfma(ae, vmul(mh, vsplat(-xd[re, b])), itof(me))
            vstore(out[pa], g * 8, aa)
            vstore(out[pb], g * 8, ab)
            vstore(out[pc], g * 8, ac)
            vstore(out[pe], g * 8, ae)
            j += 4
        while j + 1 < j1 and group >= 2:  # two pairs at a time: the weight unpacked once for both
            p, p2 = order[j], order[j + 1]
            xr, xr2 = _xrow(p, U, Ux), _xrow(p2, U, Ux)
            xqa, bsa, xqb, bsb = xq[xr], bs32[xr], xq[xr2], bs32[xr2]
            acc, acc2 = vzero(), vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if j == j0:
                    x8_prefetch(Rf, pf + t, X8_BYTES, total, pfd)
                ia, ma, ib, mb = _x8_block2(w, t, xqa, xqb, b * QK_K, bsa, bsb, b * 8)
                dh, mh = xh8(w, t + X8_D), xh8(w, t + X8_DMIN)
                acc = vfma(acc, vmul(dh, vsplat(xd[xr, b])), itof(ia))
                acc = vfma(acc, vmul(mh, vsplat(-xd[xr, b])), itof(ma))
                acc2 = vfma(acc2, vmul(dh, vsplat(xd[xr2, b])), itof(ib))
                acc2 = vfma(acc2, vmul(mh, vsplat(-xd[xr2, b])), itof(mb))
            vstore(out[p], g * 8, acc)
            vstore(out[p2], g * 8, acc2)
            j += 2
        while j < j1:
            p = order[j]
            xr = _xrow(p, U, Ux)
            xqm, b32m = xq[xr], bs32[xr]
            acc = vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if j == j0:
                    x8_prefetch(Rf, pf + t, X8_BYTES, total, pfd)
                isum, msum = _x8_block(w, t, xqm, b * QK_K, b32m, b * 8)
                acc = vfma(acc, vmul(xh8(w, t + X8_D), vsplat(xd[xr, b])), itof(isum))
                acc = vfma(acc, vmul(xh8(w, t + X8_DMIN), vsplat(-xd[xr, b])), itof(msum))
            vstore(out[p], g * 8, acc)
            j += 1
    _nan_pairs(out, order, starts, active, U, Ux, ok)
    return np.int64(-1)


@njit(parallel=True, cache=True)
def moe_q4_k_x8(R, x, ids, out, max_rows, chunks, pfd):
    return _moe_x8(R, x, ids, out, max_rows, chunks, pfd, 4)


@njit(parallel=True, cache=True)
def moe_q4_k_x8_1(R, x, ids, out, max_rows, chunks, pfd):
    """``moe_q4_k_x8`` with each pair on its own (the same outputs bit for bit; tests and A/B)."""
    return _moe_x8(R, x, ids, out, max_rows, chunks, pfd, 1)
