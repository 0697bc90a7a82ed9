"""Several activation rows per pass over a Q4_0 / Q4_1 weight repacked eight rows at a time (prompts):
the layout and the one-row kernels are ``q40_x8_kernels``'.

Each 32-byte vector of quants is read and one nibble of its 16 words picked once for four rows
(``mm_q4_0_x8r4``, ``mm_q4_1_x8r4``) or eight (``mm_q4_0_x8r8``, ``mm_q4_1_x8r8``: eight integer
accumulators, the decoded vector and a broadcast in registers; the eight float accumulators, touched
once per block, may spill). Every row's integer sums and float steps are the one-row kernel's, in the
same order, so its result is too, bit for bit: a row's result does not depend on how many rows the call
has (a prompt vs decode). The activations are quantized and permuted one row per thread
(``_prepare_rows``: the one-row kernels' ``_prepare``, bit for bit).
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np

from ..._numba import njit, prange
from .hsimd import hmadd, nan_rows, quantize_rows_q16
from .isimd import itof, izero
from .q40_x8_kernels import iadd_splat, pbcast, permute_rows_q4, wnib
from .rowgroups import prefetch_bytes, x8_prefetch_from
from .simd import vfma_strict, vmul, vsplat, vstore, vzero
from .x8simd import xh8


@njit(inline="always")
def _field4(s0, s1, s2, s3, v, x0, x1, x2, x3, i):
    return (
        hmadd(s0, v, pbcast(x0, i)),
        hmadd(s1, v, pbcast(x1, i)),
        hmadd(s2, v, pbcast(x2, i)),
        hmadd(s3, v, pbcast(x3, i)),
    )


@njit(inline="always")
def _sums4(w, q, x0, x1, x2, x3, b):
    """Four rows' integer sums of the block at activation block ``b`` whose quants start at byte ``q``."""
    s0, s1, s2, s3 = izero(), izero(), izero(), izero()
    for c in range(4):
        qc, xc = q + 32 * c, b * 32 + 8 * c
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, wnib(w, qc, 0), x0, x1, x2, x3, xc)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, wnib(w, qc, 1), x0, x1, x2, x3, xc + 2)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, wnib(w, qc, 2), x0, x1, x2, x3, xc + 4)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, wnib(w, qc, 3), x0, x1, x2, x3, xc + 6)
    return s0, s1, s2, s3


@njit(inline="always")
def _field8(s, v, xx, i):
    s0, s1, s2, s3, s4, s5, s6, s7 = s
    x0, x1, x2, x3, x4, x5, x6, x7 = xx
    return (
        hmadd(s0, v, pbcast(x0, i)),
        hmadd(s1, v, pbcast(x1, i)),
        hmadd(s2, v, pbcast(x2, i)),
        hmadd(s3, v, pbcast(x3, i)),
        hmadd(s4, v, pbcast(x4, i)),
        hmadd(s5, v, pbcast(x5, i)),
        hmadd(s6, v, pbcast(x6, i)),
        hmadd(s7, v, pbcast(x7, i)),
    )


@njit(inline="always")
def _sums8(w, q, xx, b):
    """As ``_sums4`` for the eight rows ``xx``."""
    z = izero()
    s = (z, z, z, z, z, z, z, z)
    for c in range(4):
        qc, xc = q + 32 * c, b * 32 + 8 * c
        s = _field8(s, wnib(w, qc, 0), xx, xc)
        s = _field8(s, wnib(w, qc, 1), xx, xc + 2)
        s = _field8(s, wnib(w, qc, 2), xx, xc + 4)
        s = _field8(s, wnib(w, qc, 3), xx, xc + 6)
    return s


@njit(inline="always")
def _acc(a, s, d, mn, xd, xs, cor, m, b, q41):
    """Row ``m``'s float step of block ``b``, as the one-row kernel's (``_blk_q4_0`` / ``_blk_q4_1``)."""
    if q41:  # d * xd * sum, then + m * (xd * sum(x)), each FMA rounded
        a = vfma_strict(a, vmul(d, vsplat(xd[m, b])), itof(s))
        return vfma_strict(a, mn, vsplat(xs[m, b]))
    # d * xd * (sum - 8 sum(x))
    return vfma_strict(a, vmul(d, vsplat(xd[m, b])), itof(iadd_splat(s, cor[m, b])))


@njit(inline="always")
def _pass4(w, xp, xd, xs, cor, out, grp, m0, M, nb, xbytes, q41, pfetch, Rf, pf, total):
    """Rows ``m0 .. m0 + 3`` (past ``M``: the last row again) of the group ``grp``."""
    m1, m2, m3 = min(m0 + 1, M - 1), min(m0 + 2, M - 1), min(m0 + 3, M - 1)
    x0, x1, x2, x3 = xp[m0], xp[m1], xp[m2], xp[m3]
    qoff = 32 if q41 else 16
    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
    for b in range(nb):
        t = b * xbytes
        if pfetch:
            prefetch_bytes(Rf, pf + t, xbytes, total)
        s0, s1, s2, s3 = _sums4(w, t + qoff, x0, x1, x2, x3, b)
        d = xh8(w, t)
        mn = xh8(w, t + 16) if q41 else d
        a0 = _acc(a0, s0, d, mn, xd, xs, cor, m0, b, q41)
        a1 = _acc(a1, s1, d, mn, xd, xs, cor, m1, b, q41)
        a2 = _acc(a2, s2, d, mn, xd, xs, cor, m2, b, q41)
        a3 = _acc(a3, s3, d, mn, xd, xs, cor, m3, b, q41)
    vstore(out[m3], grp * 8, a3)  # rows past M repeat the last one: written again, same values
    vstore(out[m2], grp * 8, a2)
    vstore(out[m1], grp * 8, a1)
    vstore(out[m0], grp * 8, a0)


@njit(inline="always")
def _pass8(w, xp, xd, xs, cor, out, grp, m0, nb, xbytes, q41, pfetch, Rf, pf, total):
    """Rows ``m0 .. m0 + 7`` of the group ``grp``: eight integer accumulators and one decoded vector in
    registers; the eight float accumulators, touched once per block, may live on the stack."""
    xx = (xp[m0], xp[m0 + 1], xp[m0 + 2], xp[m0 + 3], xp[m0 + 4], xp[m0 + 5], xp[m0 + 6], xp[m0 + 7])
    qoff = 32 if q41 else 16
    z = vzero()
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for b in range(nb):
        t = b * xbytes
        if pfetch:
            prefetch_bytes(Rf, pf + t, xbytes, total)
        s0, s1, s2, s3, s4, s5, s6, s7 = _sums8(w, t + qoff, xx, b)
        d = xh8(w, t)
        mn = xh8(w, t + 16) if q41 else d
        a0 = _acc(a0, s0, d, mn, xd, xs, cor, m0, b, q41)
        a1 = _acc(a1, s1, d, mn, xd, xs, cor, m0 + 1, b, q41)
        a2 = _acc(a2, s2, d, mn, xd, xs, cor, m0 + 2, b, q41)
        a3 = _acc(a3, s3, d, mn, xd, xs, cor, m0 + 3, b, q41)
        a4 = _acc(a4, s4, d, mn, xd, xs, cor, m0 + 4, b, q41)
        a5 = _acc(a5, s5, d, mn, xd, xs, cor, m0 + 5, b, q41)
        a6 = _acc(a6, s6, d, mn, xd, xs, cor, m0 + 6, b, q41)
        a7 = _acc(a7, s7, d, mn, xd, xs, cor, m0 + 7, b, q41)
    g = grp * 8
    vstore(out[m0], g, a0)
    vstore(out[m0 + 1], g, a1)
    vstore(out[m0 + 2], g, a2)
    vstore(out[m0 + 3], g, a3)
    vstore(out[m0 + 4], g, a4)
    vstore(out[m0 + 5], g, a5)
    vstore(out[m0 + 6], g, a6)
    vstore(out[m0 + 7], g, a7)


@njit(inline="always")
def _prepare_rows(x, nb):
    """``q40_x8_kernels._prepare``'s arrays, bit for bit, one activation row per thread (a prompt's rows:
    done serially it was ~4 % of a 1.5B prompt's CPU time, twice that of its wall time on 2 threads)."""
    M = x.shape[0]
    K = nb * 32
    xq = np.empty((M, K), np.int16)
    xd = np.empty((M, nb), np.float32)
    xs = np.empty((M, nb), np.float32)
    xp = np.empty((M, K), np.int16)
    cor = np.empty((M, nb), np.int32)
    ok = np.empty(M, np.bool_)
    for m in prange(M):
        ok[m] = quantize_rows_q16(x[m : m + 1], xq[m : m + 1], xd[m : m + 1], xs[m : m + 1])[0]
        permute_rows_q4(xq, xp, cor, m, nb, -8)
    return xp, xd, xs, cor, ok


@njit(inline="always")
def _rows(R, x, out, pfd, xbytes, q41, eight):
    """Every row of ``x`` against the repacked ``R``: passes of eight rows (``eight``), the rest four at a
    time."""
    G, gb = R.shape
    nb = gb // xbytes
    M = x.shape[0]
    Rf = R.reshape(-1)
    total = G * gb
    xp, xd, xs, cor, ok = _prepare_rows(x, nb)
    M8 = M // 8 * 8 if eight else 0
    for grp in prange(G):
        w = R[grp]
        pf = x8_prefetch_from(grp, gb, pfd)
        for m0 in range(0, M8, 8):
            _pass8(w, xp, xd, xs, cor, out, grp, m0, nb, xbytes, q41, m0 == 0, Rf, pf, total)
        for m0 in range(M8, M, 4):
            _pass4(w, xp, xd, xs, cor, out, grp, m0, M, nb, xbytes, q41, m0 == 0, Rf, pf, total)
    nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mm_q4_0_x8r4(R, x, out, pfd):
    """As ``q40_x8_kernels.mm_q4_0_x8``, four activation rows per pass over the weight: each weight vector
    is decoded once for four rows; every row's result is the one-row kernel's, bit for bit."""
    _rows(R, x, out, pfd, 144, False, False)


@njit(parallel=True, cache=True)
def mm_q4_1_x8r4(R, x, out, pfd):
    """As ``mm_q4_0_x8r4`` for Q4_1 (``q40_x8_kernels.mm_q4_1_x8``'s result, bit for bit)."""
    _rows(R, x, out, pfd, 160, True, False)


@njit(parallel=True, cache=True)
def mm_q4_0_x8r8(R, x, out, pfd):
    """As ``mm_q4_0_x8r4``, eight activation rows per pass (the last ``M % 8`` four at a time): each decoded
    weight vector serves eight rows; every row's result is the one-row kernel's, bit for bit."""
    _rows(R, x, out, pfd, 144, False, True)


@njit(parallel=True, cache=True)
def mm_q4_1_x8r8(R, x, out, pfd):
    """As ``mm_q4_0_x8r8`` for Q4_1."""
    _rows(R, x, out, pfd, 160, True, True)


#: the several-rows-per-pass kernel of each type
KERNELS_R4 = {"Q4_0": mm_q4_0_x8r4, "Q4_1": mm_q4_1_x8r4}
#: eight rows per pass
KERNELS_R8 = {"Q4_0": mm_q4_0_x8r8, "Q4_1": mm_q4_1_x8r8}
