"""Mat-vec kernels for 5 to ``MATVEC_MAX_TOKENS`` activation rows and the 32-element block types
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and MXFP4: each weight block is decoded once for up to EIGHT rows,
straight into its float values (``d * (q - 8)``, ``d * q + m``, ...: four ``F32x8`` vectors), so that
each row then costs only its four FMAs per block (plus one add of the block's partial sum).

``batch_kernels`` (2 to 4 rows) keeps the one-row kernels' order instead (products of the unscaled
quants, scale and offset per block): with few rows that order is faster, with many this one is
(benchmarks/bench_matvec.py, 576x1536 Q4_1, one thread: 8 rows 190 us here against 290 there; 2 rows
100 against 80). Eight accumulators and four weight vectors fit the 16 AVX2 registers.

Consistency: within a call every row goes through the same operations, so its result does not depend
on the other rows; against ``batch_kernels`` / the one-row kernels it differs in float rounding only
(the scale is applied to each weight instead of to each block's sum; ~1e-6 relative).
Call as ``MATVEC``: ``kern(w, x, out, f16)``.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import (
    Q4_0_BYTES,
    Q4_0_QS,
    Q4_1_BYTES,
    Q4_1_M,
    Q4_1_QS,
    Q5_0_BYTES,
    Q5_0_QH,
    Q5_0_QS,
    Q5_1_BYTES,
    Q5_1_M,
    Q5_1_QH,
    Q5_1_QS,
    Q8_0_BYTES,
    Q8_0_QS,
)
from ..quants.mxfp4 import E8M0_HALF
from .batch_kernels import BITS16, _bits, _nibs
from .mxfp4_kernels import vfp4
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes
from .simd import (
    vadd_strict,
    vfma_strict,
    vhsum,
    vi8,
    vload,
    vmul,
    vmul_strict,
    vsplat,
    vsub,
    vsub_strict,
    vzero,
)

_F8 = np.float32(8.0)
_F16 = np.float32(16.0)


@njit(inline="always")
def _dot(w0, w1, w2, w3, xm, i):
    """One row's products with the block, in this order (strict: see ``simd.vadd_strict``)."""
    t = vmul_strict(w0, vload(xm, i))
    t = vfma_strict(t, w1, vload(xm, i + 8))
    t = vfma_strict(t, w2, vload(xm, i + 16))
    return vfma_strict(t, w3, vload(xm, i + 24))


@njit(inline="always")
def _acc8(a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, w2, w3, xf, x0, x1, x2, x3, x4, x5, x6, x7, i, n):
    """The block's products for the group's rows: two, four or eight of them (``n`` rows left). The
    rows are offsets into the flat activations and the accumulators plain arguments: array views or
    tuples of them inside the row loop cost reference counting (measured: 2-5x slower)."""
    a0 = vadd_strict(a0, _dot(w0, w1, w2, w3, xf, x0 + i))
    a1 = vadd_strict(a1, _dot(w0, w1, w2, w3, xf, x1 + i))
    if n > 2:
        a2 = vadd_strict(a2, _dot(w0, w1, w2, w3, xf, x2 + i))
        a3 = vadd_strict(a3, _dot(w0, w1, w2, w3, xf, x3 + i))
    if n > 4:
        a4 = vadd_strict(a4, _dot(w0, w1, w2, w3, xf, x4 + i))
        a5 = vadd_strict(a5, _dot(w0, w1, w2, w3, xf, x5 + i))
        a6 = vadd_strict(a6, _dot(w0, w1, w2, w3, xf, x6 + i))
        a7 = vadd_strict(a7, _dot(w0, w1, w2, w3, xf, x7 + i))
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n):
    """Each row's sum (rows repeated past the end are written before the real one)."""
    L = out.shape[0] - 1
    if n > 4:
        out[min(m0 + 7, L), r] = vhsum(a7)
        out[min(m0 + 6, L), r] = vhsum(a6)
        out[min(m0 + 5, L), r] = vhsum(a5)
        out[min(m0 + 4, L), r] = vhsum(a4)
    if n > 2:
        out[min(m0 + 3, L), r] = vhsum(a3)
        out[min(m0 + 2, L), r] = vhsum(a2)
    out[min(m0 + 1, L), r] = vhsum(a1)
    out[m0, r] = vhsum(a0)


# One kernel per type (a body taking the decoder as an argument would not cache).
@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q4_0(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q4_0_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q4_0_BYTES, Q4_0_BYTES, N * rb)
                o = b * Q4_0_BYTES
                q0, q1, q2, q3 = _nibs(wr, o + Q4_0_QS)
                d, c = vsplat(f16at(wr, o, f16)), vsplat(_F8)
                w0, w1, w2, w3 = (
                    vmul(d, vsub(q0, c)),
                    vmul(d, vsub(q1, c)),
                    vmul(d, vsub(q2, c)),
                    vmul(d, vsub(q3, c)),
                )
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    a7,
                    w0,
                    w1,
                    w2,
                    w3,
                    xf,
                    x0,
                    x1,
                    x2,
                    x3,
                    x4,
                    x5,
                    x6,
                    x7,
                    b * 32,
                    n,
                )
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q4_1(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q4_1_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q4_1_BYTES, Q4_1_BYTES, N * rb)
                o = b * Q4_1_BYTES
                q0, q1, q2, q3 = _nibs(wr, o + Q4_1_QS)
                d, mn = vsplat(f16at(wr, o, f16)), vsplat(f16at(wr, o + Q4_1_M, f16))
                w0, w1, w2, w3 = (
                    vfma_strict(mn, d, q0),
                    vfma_strict(mn, d, q1),
                    vfma_strict(mn, d, q2),
                    vfma_strict(mn, d, q3),
                )
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    a7,
                    w0,
                    w1,
                    w2,
                    w3,
                    xf,
                    x0,
                    x1,
                    x2,
                    x3,
                    x4,
                    x5,
                    x6,
                    x7,
                    b * 32,
                    n,
                )
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q5_0(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q5_0_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    bits = BITS16
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q5_0_BYTES, Q5_0_BYTES, N * rb)
                o = b * Q5_0_BYTES
                q0, q1, q2, q3 = _nibs(wr, o + Q5_0_QS)
                h0, h1, h2, h3 = _bits(wr, o + Q5_0_QH, bits)
                d, c = vsplat(f16at(wr, o, f16)), vsplat(_F16)
                w0, w1 = (
                    vmul_strict(d, vsub_strict(vadd_strict(q0, h0), c)),
                    vmul_strict(d, vsub_strict(vadd_strict(q1, h1), c)),
                )
                w2, w3 = (
                    vmul_strict(d, vsub_strict(vadd_strict(q2, h2), c)),
                    vmul_strict(d, vsub_strict(vadd_strict(q3, h3), c)),
                )
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    a7,
                    w0,
                    w1,
                    w2,
                    w3,
                    xf,
                    x0,
                    x1,
                    x2,
                    x3,
                    x4,
                    x5,
                    x6,
                    x7,
                    b * 32,
                    n,
                )
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q5_1(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q5_1_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    bits = BITS16
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q5_1_BYTES, Q5_1_BYTES, N * rb)
                o = b * Q5_1_BYTES
                q0, q1, q2, q3 = _nibs(wr, o + Q5_1_QS)
                h0, h1, h2, h3 = _bits(wr, o + Q5_1_QH, bits)
                d, mn = vsplat(f16at(wr, o, f16)), vsplat(f16at(wr, o + Q5_1_M, f16))
                w0, w1 = vfma_strict(mn, d, vadd_strict(q0, h0)), vfma_strict(mn, d, vadd_strict(q1, h1))
                w2, w3 = vfma_strict(mn, d, vadd_strict(q2, h2)), vfma_strict(mn, d, vadd_strict(q3, h3))
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    a7,
                    w0,
                    w1,
                    w2,
                    w3,
                    xf,
                    x0,
                    x1,
                    x2,
                    x3,
                    x4,
                    x5,
                    x6,
                    x7,
                    b * 32,
                    n,
                )
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_q8_0(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q8_0_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q8_0_BYTES, Q8_0_BYTES, N * rb)
                o = b * Q8_0_BYTES
                q = o + Q8_0_QS
                d = vsplat(f16at(wr, o, f16))
                w0, w1 = vmul_strict(d, vi8(wr, q)), vmul_strict(d, vi8(wr, q + 8))
                w2, w3 = vmul_strict(d, vi8(wr, q + 16)), vmul_strict(d, vi8(wr, q + 24))
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    a7,
                    w0,
                    w1,
                    w2,
                    w3,
                    xf,
                    x0,
                    x1,
                    x2,
                    x3,
                    x4,
                    x5,
                    x6,
                    x7,
                    b * 32,
                    n,
                )
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)


@njit(parallel=True, cache=True, fastmath=True)
def mmb8_mxfp4(w, x, out, f16):
    e8 = E8M0_HALF
    N, rb = w.shape
    M, nb = x.shape[0], rb // 17
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 8):
            n, L = M - m0, M - 1
            x0, x1, x2, x3 = m0 * K, min(m0 + 1, L) * K, min(m0 + 2, L) * K, min(m0 + 3, L) * K
            x4, x5, x6, x7 = min(m0 + 4, L) * K, min(m0 + 5, L) * K, min(m0 + 6, L) * K, min(m0 + 7, L) * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * 17, 17, N * rb)
                o = b * 17
                q = o + 1
                d = vsplat(e8[wr[o]])
                w0, w1 = vmul_strict(d, vfp4(wr, q, False)), vmul_strict(d, vfp4(wr, q + 8, False))
                w2, w3 = vmul_strict(d, vfp4(wr, q, True)), vmul_strict(d, vfp4(wr, q + 8, True))
                a0, a1, a2, a3, a4, a5, a6, a7 = _acc8(
                    a0,
                    a1,
                    a2,
                    a3,
                    a4,
                    a5,
                    a6,
                    a7,
                    w0,
                    w1,
                    w2,
                    w3,
                    xf,
                    x0,
                    x1,
                    x2,
                    x3,
                    x4,
                    x5,
                    x6,
                    x7,
                    b * 32,
                    n,
                )
            _store8(out, r, m0, a0, a1, a2, a3, a4, a5, a6, a7, n)
