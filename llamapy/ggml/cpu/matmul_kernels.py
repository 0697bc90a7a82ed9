"""Numba kernels for quantized weights: mat-vec / small-batch dot products that decode blocks in
registers, never writing a float copy of the weight.

Every kernel is compiled on first use (``cache=True``), so a model only pays for its own types.
Call: ``MATVEC[type](w, x, out, f16)`` with ``w`` the raw weight ``uint8[N, row_bytes]``
(C-contiguous), ``x`` the activations ``float32[M, K]`` (C-contiguous), ``out`` ``float32[M, N]``
and ``f16`` the 65536-entry half -> float table; ``out[m, r] = sum_k W[r, k] * x[m, k]``.

How they are built (numbers: AVX2 VM, ``benchmarks/bench_matvec.py``):
- values are ``simd.F32x8`` vectors: each row keeps eight partial sums in a register across all its
  blocks, each block's scale multiplies the whole vector, and the row is summed horizontally once at
  the end (scalar loops end every 32-element block in a horizontal sum: 1.35x slower on Q4_0);
- four rows per pass share the loaded activations (Q6_K: one row); the offsets and mins of the
  formats fold into per-block sums of ``x``, also kept as vectors;
- software prefetch of the rows ``PREFETCH_ROWS`` ahead: 2.2x on a 178 MB Q8_0 matrix;
- ``prange`` over groups of rows; the last group repeats its last row instead of a second code path.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.fast import F16_TABLE  # noqa: F401  (re-exported: the kernels' ``f16`` argument)
from .simd import (
    bits32,
    prefetch,
    u16at,
    vadd,
    vfma,
    vhsum,
    vi8,
    vkscales,
    vlane,
    vload,
    vmul,
    vq4,
    vq6,
    vsplat,
    vsub,
    vzero,
)

_F8 = np.float32(8.0)
_F16 = np.float32(16.0)
_I15 = np.int32(15)
_I63 = np.int32(63)
_I4 = np.int32(4)
_I6 = np.int32(6)
#: rows ahead of the current group whose bytes are prefetched (the hardware prefetcher alone leaves
#: a large mat-vec at ~40 % of the bus)
PREFETCH_ROWS = 16


@njit(inline="always")
def _h(w, o, f16):
    return f16[u16at(w, o)]


@njit(inline="always")
def _pf(wf, p, nbytes, total):
    """Prefetch ``nbytes`` from flat offset ``p`` of the weight (skipped past its end)."""
    if p + nbytes <= total:
        for c in range(0, nbytes, 64):
            prefetch(wf, p + c)


@njit(inline="always")
def _rows4(w, g, N):
    r0 = g * 4
    return w[r0], w[min(r0 + 1, N - 1)], w[min(r0 + 2, N - 1)], w[min(r0 + 3, N - 1)]


@njit(inline="always")
def _store4(out, m, g, N, a0, a1, a2, a3):
    r0 = g * 4
    out[m, min(r0 + 3, N - 1)] = vhsum(a3)
    out[m, min(r0 + 2, N - 1)] = vhsum(a2)
    out[m, min(r0 + 1, N - 1)] = vhsum(a1)
    out[m, r0] = vhsum(a0)


# -- 32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ------------------------------------------------
@njit(inline="always")
def _nib(wr, q, x0, x1, x2, x3):
    """sum of nibble * x over a 16-byte run of quants at ``q`` (low nibbles: elements 0-15)."""
    t = vmul(vq4(wr, q, False), x0)
    t = vfma(t, vq4(wr, q + 8, False), x1)
    t = vfma(t, vq4(wr, q, True), x2)
    return vfma(t, vq4(wr, q + 8, True), x3)


#: BITS16[8 * v + j] = 16.0 if bit j of the byte v is set: the fifth bits of 8 Q5_0/Q5_1 elements
#: as one vector load (8 KiB, stays in L1), instead of four integer operations per 8 elements
BITS16 = np.array([16.0 * ((v >> j) & 1) for v in range(256) for j in range(8)], np.float32)


@njit(inline="always")
def _nib5(wr, q, qh, x0, x1, x2, x3, bits):
    """As ``_nib`` with the 32 fifth bits in the 4 bytes at ``qh`` (bit j belongs to element j)."""
    t = _nib(wr, q, x0, x1, x2, x3)
    t = vfma(t, vload(bits, np.int64(wr[qh]) * 8), x0)
    t = vfma(t, vload(bits, np.int64(wr[qh + 1]) * 8), x1)
    t = vfma(t, vload(bits, np.int64(wr[qh + 2]) * 8), x2)
    return vfma(t, vload(bits, np.int64(wr[qh + 3]) * 8), x3)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_0(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 18
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 72, 72, N * rb)
                o = b * 18
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                c = vmul(vadd(vadd(x0, x1), vadd(x2, x3)), vsplat(_F8))  # the -8 offset
                a0 = vfma(a0, vsplat(_h(w0, o, f16)), vsub(_nib(w0, o + 2, x0, x1, x2, x3), c))
                a1 = vfma(a1, vsplat(_h(w1, o, f16)), vsub(_nib(w1, o + 2, x0, x1, x2, x3), c))
                a2 = vfma(a2, vsplat(_h(w2, o, f16)), vsub(_nib(w2, o + 2, x0, x1, x2, x3), c))
                a3 = vfma(a3, vsplat(_h(w3, o, f16)), vsub(_nib(w3, o + 2, x0, x1, x2, x3), c))
            _store4(out, m, g, N, a0, a1, a2, a3)


@njit(inline="always")
def _q41(acc, wr, o, x0, x1, x2, x3, xsum, f16):
    acc = vfma(acc, vsplat(_h(wr, o, f16)), _nib(wr, o + 4, x0, x1, x2, x3))
    return vfma(acc, vsplat(_h(wr, o + 2, f16)), xsum)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_1(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 20
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 80, 80, N * rb)
                o = b * 20
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                s = vadd(vadd(x0, x1), vadd(x2, x3))  # times the min
                a0 = _q41(a0, w0, o, x0, x1, x2, x3, s, f16)
                a1 = _q41(a1, w1, o, x0, x1, x2, x3, s, f16)
                a2 = _q41(a2, w2, o, x0, x1, x2, x3, s, f16)
                a3 = _q41(a3, w3, o, x0, x1, x2, x3, s, f16)
            _store4(out, m, g, N, a0, a1, a2, a3)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_0(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 22
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 88, 88, N * rb)
                o = b * 22
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                c = vmul(vadd(vadd(x0, x1), vadd(x2, x3)), vsplat(_F16))  # the -16 offset
                a0 = vfma(
                    a0, vsplat(_h(w0, o, f16)), vsub(_nib5(w0, o + 6, o + 2, x0, x1, x2, x3, BITS16), c)
                )
                a1 = vfma(
                    a1, vsplat(_h(w1, o, f16)), vsub(_nib5(w1, o + 6, o + 2, x0, x1, x2, x3, BITS16), c)
                )
                a2 = vfma(
                    a2, vsplat(_h(w2, o, f16)), vsub(_nib5(w2, o + 6, o + 2, x0, x1, x2, x3, BITS16), c)
                )
                a3 = vfma(
                    a3, vsplat(_h(w3, o, f16)), vsub(_nib5(w3, o + 6, o + 2, x0, x1, x2, x3, BITS16), c)
                )
            _store4(out, m, g, N, a0, a1, a2, a3)


@njit(inline="always")
def _q51(acc, wr, o, x0, x1, x2, x3, xsum, f16):
    acc = vfma(acc, vsplat(_h(wr, o, f16)), _nib5(wr, o + 8, o + 4, x0, x1, x2, x3, BITS16))
    return vfma(acc, vsplat(_h(wr, o + 2, f16)), xsum)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_1(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 24
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 96, 96, N * rb)
                o = b * 24
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                s = vadd(vadd(x0, x1), vadd(x2, x3))
                a0 = _q51(a0, w0, o, x0, x1, x2, x3, s, f16)
                a1 = _q51(a1, w1, o, x0, x1, x2, x3, s, f16)
                a2 = _q51(a2, w2, o, x0, x1, x2, x3, s, f16)
                a3 = _q51(a3, w3, o, x0, x1, x2, x3, s, f16)
            _store4(out, m, g, N, a0, a1, a2, a3)


@njit(inline="always")
def _q80(acc, wr, o, x0, x1, x2, x3, f16):
    t = vmul(vi8(wr, o + 2), x0)
    t = vfma(t, vi8(wr, o + 10), x1)
    t = vfma(t, vi8(wr, o + 18), x2)
    t = vfma(t, vi8(wr, o + 26), x3)
    return vfma(acc, vsplat(_h(wr, o, f16)), t)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q8_0(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 34
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 136, 136, N * rb)
                o = b * 34
                x0, x1, x2, x3 = (
                    vload(xm, b * 32),
                    vload(xm, b * 32 + 8),
                    vload(xm, b * 32 + 16),
                    vload(xm, b * 32 + 24),
                )
                a0 = _q80(a0, w0, o, x0, x1, x2, x3, f16)
                a1 = _q80(a1, w1, o, x0, x1, x2, x3, f16)
                a2 = _q80(a2, w2, o, x0, x1, x2, x3, f16)
                a3 = _q80(a3, w3, o, x0, x1, x2, x3, f16)
            _store4(out, m, g, N, a0, a1, a2, a3)


# -- 256-element super-blocks: Q4_K, Q5_K, Q6_K -----------------------------------------------------
@njit(inline="always")
def _q4k_dots(wr, q, xm, x0):
    """Dot products of a 64-element chunk's two halves (low nibbles of the 32 bytes at ``q`` with
    x[x0:x0+32], high nibbles with x[x0+32:x0+64])."""
    lo = vmul(vq4(wr, q, False), vload(xm, x0))
    hi = vmul(vq4(wr, q, True), vload(xm, x0 + 32))
    for i in range(1, 4):
        lo = vfma(lo, vq4(wr, q + 8 * i, False), vload(xm, x0 + 8 * i))
        hi = vfma(hi, vq4(wr, q + 8 * i, True), vload(xm, x0 + 32 + 8 * i))
    return lo, hi


@njit(inline="always")
def _bits_dot(t, bits, mask, xm, x0):
    """t + 16 * sum of x[x0 + l] over the set bits l of the 32-bit ``mask`` (four table loads)."""
    for i in range(4):
        t = vfma(t, vload(bits, ((mask >> (8 * i)) & 255) * 8), vload(xm, x0 + 8 * i))
    return t


@njit(inline="always")
def _q5k_dots(wr, q, qh, c, xm, x0):
    """As ``_q4k_dots`` with the fifth bits (bits 2c and 2c+1 of the 32 bytes at ``qh``), gathered
    into two 32-bit masks and added through the ``BITS16`` table."""
    lo, hi = _q4k_dots(wr, q, xm, x0)
    lo = _bits_dot(lo, BITS16, bits32(wr, qh, 2 * c), xm, x0)
    hi = _bits_dot(hi, BITS16, bits32(wr, qh, 2 * c + 1), xm, x0 + 32)
    return lo, hi


@njit(inline="always")
def _q4k_row(acc, macc, wr, o, xm, x0, xs8, f16):
    """One Q4_K block of one row (x from ``x0``): the scaled quants into the vector ``acc``; dmin times
    the mins against the per-32 sums of x (``xs8``, a vector) into the vector ``macc`` (subtracted at
    the end)."""
    sc, mn = vkscales(wr, o + 4)
    dsc = vmul(vsplat(_h(wr, o, f16)), sc)
    for c in range(4):
        lo, hi = _q4k_dots(wr, o + 16 + 32 * c, xm, x0 + 64 * c)
        acc = vfma(acc, vlane(dsc, 2 * c), lo)
        acc = vfma(acc, vlane(dsc, 2 * c + 1), hi)
    return acc, vfma(macc, vsplat(_h(wr, o + 2, f16)), vmul(mn, xs8))


@njit(inline="always")
def _q5k_row(acc, macc, wr, o, xm, x0, xs8, f16):
    """As ``_q4k_row`` for Q5_K."""
    sc, mn = vkscales(wr, o + 4)
    dsc = vmul(vsplat(_h(wr, o, f16)), sc)
    for c in range(4):
        lo, hi = _q5k_dots(wr, o + 48 + 32 * c, o + 16, c, xm, x0 + 64 * c)
        acc = vfma(acc, vlane(dsc, 2 * c), lo)
        acc = vfma(acc, vlane(dsc, 2 * c + 1), hi)
    return acc, vfma(macc, vsplat(_h(wr, o + 2, f16)), vmul(mn, xs8))


@njit(inline="always")
def _xsums(x, n):
    """Sums of x over each ``n`` elements, float32[M, K // n] (a plain loop: an array expression here
    would become a parallel region of its own)."""
    M, K = x.shape
    xs = np.empty((M, K // n), np.float32)
    for m in range(M):
        for b in range(K // n):
            s = np.float32(0.0)
            for j in range(n):
                s += x[m, b * n + j]
            xs[m, b] = s
    return xs


# mm_q4_k and mm_q5_k differ only in their row function. They are written out: one inlined body with a
# flag choosing the row function compiled both into each kernel (measured: 80-100 s to compile, not 4 s).
@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_k(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 144
    wf = w.reshape(-1)
    xs = _xsums(x, 32)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            xsm = xs[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            c0, c1, c2, c3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 4 * 144, 4 * 144, N * rb)
                o = b * 144
                xs8 = vload(xsm, b * 8)
                a0, c0 = _q4k_row(a0, c0, w0, o, xm, b * 256, xs8, f16)
                a1, c1 = _q4k_row(a1, c1, w1, o, xm, b * 256, xs8, f16)
                a2, c2 = _q4k_row(a2, c2, w2, o, xm, b * 256, xs8, f16)
                a3, c3 = _q4k_row(a3, c3, w3, o, xm, b * 256, xs8, f16)
            _store4(out, m, g, N, vsub(a0, c0), vsub(a1, c1), vsub(a2, c2), vsub(a3, c3))


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_k(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 176
    wf = w.reshape(-1)
    xs = _xsums(x, 32)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = _rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            xsm = xs[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            c0, c1, c2, c3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 4 * 176, 4 * 176, N * rb)
                o = b * 176
                xs8 = vload(xsm, b * 8)
                a0, c0 = _q5k_row(a0, c0, w0, o, xm, b * 256, xs8, f16)
                a1, c1 = _q5k_row(a1, c1, w1, o, xm, b * 256, xs8, f16)
                a2, c2 = _q5k_row(a2, c2, w2, o, xm, b * 256, xs8, f16)
                a3, c3 = _q5k_row(a3, c3, w3, o, xm, b * 256, xs8, f16)
            _store4(out, m, g, N, vsub(a0, c0), vsub(a1, c1), vsub(a2, c2), vsub(a3, c3))


@njit(inline="always")
def _q6k16(acc, off, wr, q, qh, hi, shift, xm, xs16, x0, scale):
    """16 elements of a Q6_K block (one scale): quants at ``q``, their 2 high bits at ``qh``. The
    values go in as 0..63; their -32 offset, times the scale and the sum of x over the 16, into the
    scalar ``off``."""
    t = vmul(vq6(wr, q, hi, qh, shift), vload(xm, x0))
    t = vfma(t, vq6(wr, q + 8, hi, qh + 8, shift), vload(xm, x0 + 8))
    return vfma(acc, vsplat(scale), t), off + scale * xs16[x0 // 16]


@njit(inline="always")
def _q6k_half(acc, off, wr, si, o, n, xm, xs16, x0, d):
    """One 128-element half ``n`` of a Q6_K block: four groups of 32 (low/high nibbles of the two
    32-byte runs of ``ql``, with bits 0-1, 2-3, 4-5, 6-7 of ``qh``), 16 elements per scale."""
    ql = o + 64 * n
    qh = o + 128 + 32 * n
    sc = o + 192 + 8 * n
    for i in range(2):
        e = 16 * i
        acc, off = _q6k16(
            acc, off, wr, ql + e, qh + e, False, 0, xm, xs16, x0 + e, d * np.float32(si[sc + i])
        )
        acc, off = _q6k16(
            acc, off, wr, ql + 32 + e, qh + e, False, 2, xm, xs16, x0 + 32 + e, d * np.float32(si[sc + 2 + i])
        )
        acc, off = _q6k16(
            acc, off, wr, ql + e, qh + e, True, 4, xm, xs16, x0 + 64 + e, d * np.float32(si[sc + 4 + i])
        )
        acc, off = _q6k16(
            acc, off, wr, ql + 32 + e, qh + e, True, 6, xm, xs16, x0 + 96 + e, d * np.float32(si[sc + 6 + i])
        )
    return acc, off


@njit(parallel=True, cache=True, fastmath=True)
def mm_q6_k(w, x, out, f16):
    N, rb = w.shape
    nb = rb // 210
    wf = w.reshape(-1)
    wi = w.view(np.int8)
    xs = _xsums(x, 16)
    for r in prange(N):
        wr = w[r]
        si = wi[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xm = x[m]
            acc = vzero()
            off = np.float32(0.0)
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 210, 210, N * rb)
                o = b * 210
                d = _h(wr, o + 208, f16)
                acc, off = _q6k_half(acc, off, wr, si, o, 0, xm, xs[m], b * 256, d)
                acc, off = _q6k_half(acc, off, wr, si, o, 1, xm, xs[m], b * 256 + 128, d)
            out[m, r] = vhsum(acc) - np.float32(32.0) * off


MATVEC = {
    "Q4_0": mm_q4_0, "Q4_1": mm_q4_1, "Q5_0": mm_q5_0, "Q5_1": mm_q5_1, "Q8_0": mm_q8_0,
    "Q4_K": mm_q4_k, "Q5_K": mm_q5_k, "Q6_K": mm_q6_k,
}  # fmt: skip
