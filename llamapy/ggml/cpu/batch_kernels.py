"""Small-batch mat-vec kernels (2 to ``MATVEC_MAX_TOKENS`` activation rows) for the 32-element block
types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and MXFP4: each weight block is decoded ONCE into registers and
used for up to four activation rows, instead of once per row as the one-row kernels of
``matmul_kernels`` do (there a batch of k rows costs k single-row calls).

Shape of a pass: one weight row against a group of four activation rows (the last group has two,
or repeats its last row): the row's block is unpacked into four ``F32x8`` vectors (Q5: eight, with
the fifth bits), then each of the four rows takes its products from them into its own accumulator.
Four accumulators, four (eight) weight vectors and the block scale fit the 16 AVX2 registers; the
activations come straight from L1 as the FMAs' memory operands. ``prange`` runs over weight rows.
The per-block sums of the activations (the offset / min term) are computed once per call.

Consistency: each row's result is written with the same vector operations in the same order as in
the one-row kernel (products of the unscaled quants, ``acc + d * (t - offset)`` or ``+ m * sum(x)``,
one horizontal sum at the end), but with ``simd``'s strict operations (no fast-math flags), so that
LLVM cannot fold them differently into the copies of the loop body for different rows: a row's result
does not depend on which other rows are in the batch or where it sits (tested bit for bit). Against
the one-row kernels (fast-math: LLVM reorders their sums) they differ in float rounding only (~1e-6
relative; on the AVX-512 dev host Q8_0 and MXFP4 came out bit for bit equal).

Call as ``MATVEC``: ``kern(w, x, out, f16)`` (``matmul_kernels.MATVEC_BATCH``).
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
from .mxfp4_kernels import vfp4
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes
from .simd import (
    vadd,
    vfma_strict,
    vhsum,
    vi8,
    vload,
    vmul_strict,
    vq4,
    vsplat,
    vstore,
    vsub_strict,
    vzero,
)

_F8 = np.float32(8.0)
_F16 = np.float32(16.0)
#: BITS16[8 * v + j] = 16.0 if bit j of the byte v is set: the fifth bits of 8 Q5_0/Q5_1 elements
#: as one vector load (8 KiB, stays in L1)
BITS16 = np.array([16.0 * ((v >> j) & 1) for v in range(256) for j in range(8)], np.float32)


@njit(inline="always")
def _xsums(x, nb):
    """Per 32-element block of each row: the 8-lane sum (x0 + x1) + (x2 + x3) of its four vectors,
    as the one-row kernels compute it."""
    M = x.shape[0]
    xs = np.empty((M, nb * 8), np.float32)
    for m in range(M):
        xm, xsm = x[m], xs[m]
        for b in range(nb):
            i = b * 32
            s = vadd(vadd(vload(xm, i), vload(xm, i + 8)), vadd(vload(xm, i + 16), vload(xm, i + 24)))
            vstore(xsm, b * 8, s)
    return xs


@njit(inline="always")
def _group(m0, M):
    """The activation rows of the group at ``m0``: four (the last repeated past ``M``), or two when
    at most two are left (``full`` False)."""
    last = M - 1
    return min(m0, last), min(m0 + 1, last), min(m0 + 2, last), min(m0 + 3, last), M - m0 >= 3


@njit(inline="always")
def _dot(q0, q1, q2, q3, xm, i):
    """sum of q * x over the block's 32 elements (the one-row kernels' product order)."""
    t = vmul_strict(q0, vload(xm, i))
    t = vfma_strict(t, q1, vload(xm, i + 8))
    t = vfma_strict(t, q2, vload(xm, i + 16))
    return vfma_strict(t, q3, vload(xm, i + 24))


@njit(inline="always")
def _dot5(q0, q1, q2, q3, h0, h1, h2, h3, xm, i):
    """As ``_dot`` plus the fifth bits' products, the fifth bits as floats."""
    t = _dot(q0, q1, q2, q3, xm, i)
    t = vfma_strict(t, h0, vload(xm, i))
    t = vfma_strict(t, h1, vload(xm, i + 8))
    t = vfma_strict(t, h2, vload(xm, i + 16))
    return vfma_strict(t, h3, vload(xm, i + 24))


@njit(inline="always")
def _nibs(wr, q):
    return vq4(wr, q, False), vq4(wr, q + 8, False), vq4(wr, q, True), vq4(wr, q + 8, True)


@njit(inline="always")
def _bits(wr, qh, bits):
    return (
        vload(bits, np.int64(wr[qh]) * 8),
        vload(bits, np.int64(wr[qh + 1]) * 8),
        vload(bits, np.int64(wr[qh + 2]) * 8),
        vload(bits, np.int64(wr[qh + 3]) * 8),
    )


@njit(inline="always")
def _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full):
    if full:
        out[i3, r] = vhsum(a3)
        out[i2, r] = vhsum(a2)
    out[i1, r] = vhsum(a1)
    out[i0, r] = vhsum(a0)


# Each kernel is written out (a shared body taking the block function would not cache); they differ
# only in how a block is unpacked and how its scale and offset enter.
@njit(parallel=True, cache=True, fastmath=True)
def mmb_q4_0(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q4_0_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    xs = _xsums(x, nb)
    xsf = xs.reshape(-1)
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            s0, s1, s2, s3 = i0 * nb * 8, i1 * nb * 8, i2 * nb * 8, i3 * nb * 8
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q4_0_BYTES, Q4_0_BYTES, N * rb)
                o, i, j = b * Q4_0_BYTES, b * 32, b * 8
                q0, q1, q2, q3 = _nibs(wr, o + Q4_0_QS)
                d, c = vsplat(f16at(wr, o, f16)), vsplat(_F8)
                a0 = vfma_strict(
                    a0, d, vsub_strict(_dot(q0, q1, q2, q3, xf, x0 + i), vmul_strict(vload(xsf, s0 + j), c))
                )
                a1 = vfma_strict(
                    a1, d, vsub_strict(_dot(q0, q1, q2, q3, xf, x1 + i), vmul_strict(vload(xsf, s1 + j), c))
                )
                if full:
                    a2 = vfma_strict(
                        a2,
                        d,
                        vsub_strict(_dot(q0, q1, q2, q3, xf, x2 + i), vmul_strict(vload(xsf, s2 + j), c)),
                    )
                    a3 = vfma_strict(
                        a3,
                        d,
                        vsub_strict(_dot(q0, q1, q2, q3, xf, x3 + i), vmul_strict(vload(xsf, s3 + j), c)),
                    )
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(inline="always")
def _q41(acc, d, mn, q0, q1, q2, q3, xm, xsm, i, j):
    acc = vfma_strict(acc, d, _dot(q0, q1, q2, q3, xm, i))
    return vfma_strict(acc, mn, vload(xsm, j))


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q4_1(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q4_1_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    xs = _xsums(x, nb)
    xsf = xs.reshape(-1)
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            s0, s1, s2, s3 = i0 * nb * 8, i1 * nb * 8, i2 * nb * 8, i3 * nb * 8
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q4_1_BYTES, Q4_1_BYTES, N * rb)
                o, i, j = b * Q4_1_BYTES, b * 32, b * 8
                q0, q1, q2, q3 = _nibs(wr, o + Q4_1_QS)
                d, mn = vsplat(f16at(wr, o, f16)), vsplat(f16at(wr, o + Q4_1_M, f16))
                a0 = _q41(a0, d, mn, q0, q1, q2, q3, xf, xsf, x0 + i, s0 + j)
                a1 = _q41(a1, d, mn, q0, q1, q2, q3, xf, xsf, x1 + i, s1 + j)
                if full:
                    a2 = _q41(a2, d, mn, q0, q1, q2, q3, xf, xsf, x2 + i, s2 + j)
                    a3 = _q41(a3, d, mn, q0, q1, q2, q3, xf, xsf, x3 + i, s3 + j)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(inline="always")
def _q50(acc, d, c, q0, q1, q2, q3, h0, h1, h2, h3, xm, xsm, i, j):
    t = _dot5(q0, q1, q2, q3, h0, h1, h2, h3, xm, i)
    return vfma_strict(acc, d, vsub_strict(t, vmul_strict(vload(xsm, j), c)))


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q5_0(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q5_0_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    xs = _xsums(x, nb)
    xsf = xs.reshape(-1)
    bits = BITS16
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            s0, s1, s2, s3 = i0 * nb * 8, i1 * nb * 8, i2 * nb * 8, i3 * nb * 8
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q5_0_BYTES, Q5_0_BYTES, N * rb)
                o, i, j = b * Q5_0_BYTES, b * 32, b * 8
                q0, q1, q2, q3 = _nibs(wr, o + Q5_0_QS)
                h0, h1, h2, h3 = _bits(wr, o + Q5_0_QH, bits)
                d, c = vsplat(f16at(wr, o, f16)), vsplat(_F16)
                a0 = _q50(a0, d, c, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x0 + i, s0 + j)
                a1 = _q50(a1, d, c, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x1 + i, s1 + j)
                if full:
                    a2 = _q50(a2, d, c, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x2 + i, s2 + j)
                    a3 = _q50(a3, d, c, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x3 + i, s3 + j)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(inline="always")
def _q51(acc, d, mn, q0, q1, q2, q3, h0, h1, h2, h3, xm, xsm, i, j):
    acc = vfma_strict(acc, d, _dot5(q0, q1, q2, q3, h0, h1, h2, h3, xm, i))
    return vfma_strict(acc, mn, vload(xsm, j))


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q5_1(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q5_1_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    xs = _xsums(x, nb)
    xsf = xs.reshape(-1)
    bits = BITS16
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            s0, s1, s2, s3 = i0 * nb * 8, i1 * nb * 8, i2 * nb * 8, i3 * nb * 8
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q5_1_BYTES, Q5_1_BYTES, N * rb)
                o, i, j = b * Q5_1_BYTES, b * 32, b * 8
                q0, q1, q2, q3 = _nibs(wr, o + Q5_1_QS)
                h0, h1, h2, h3 = _bits(wr, o + Q5_1_QH, bits)
                d, mn = vsplat(f16at(wr, o, f16)), vsplat(f16at(wr, o + Q5_1_M, f16))
                a0 = _q51(a0, d, mn, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x0 + i, s0 + j)
                a1 = _q51(a1, d, mn, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x1 + i, s1 + j)
                if full:
                    a2 = _q51(a2, d, mn, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x2 + i, s2 + j)
                    a3 = _q51(a3, d, mn, q0, q1, q2, q3, h0, h1, h2, h3, xf, xsf, x3 + i, s3 + j)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_q8_0(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q8_0_BYTES
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q8_0_BYTES, Q8_0_BYTES, N * rb)
                o, i = b * Q8_0_BYTES, b * 32
                q = o + Q8_0_QS
                q0, q1, q2, q3 = vi8(wr, q), vi8(wr, q + 8), vi8(wr, q + 16), vi8(wr, q + 24)
                d = vsplat(f16at(wr, o, f16))
                a0 = vfma_strict(a0, d, _dot(q0, q1, q2, q3, xf, x0 + i))
                a1 = vfma_strict(a1, d, _dot(q0, q1, q2, q3, xf, x1 + i))
                if full:
                    a2 = vfma_strict(a2, d, _dot(q0, q1, q2, q3, xf, x2 + i))
                    a3 = vfma_strict(a3, d, _dot(q0, q1, q2, q3, xf, x3 + i))
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(parallel=True, cache=True, fastmath=True)
def mmb_mxfp4(w, x, out, f16):
    e8 = E8M0_HALF
    N, rb = w.shape
    M, nb = x.shape[0], rb // 17
    wf, xf, K = w.reshape(-1), x.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            x0, x1, x2, x3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * 17, 17, N * rb)
                o, i = b * 17, b * 32
                q = o + 1
                q0, q1 = vfp4(wr, q, False), vfp4(wr, q + 8, False)
                q2, q3 = vfp4(wr, q, True), vfp4(wr, q + 8, True)
                d = vsplat(e8[wr[o]])
                a0 = vfma_strict(a0, d, _dot(q0, q1, q2, q3, xf, x0 + i))
                a1 = vfma_strict(a1, d, _dot(q0, q1, q2, q3, xf, x1 + i))
                if full:
                    a2 = vfma_strict(a2, d, _dot(q0, q1, q2, q3, xf, x2 + i))
                    a3 = vfma_strict(a3, d, _dot(q0, q1, q2, q3, xf, x3 + i))
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
