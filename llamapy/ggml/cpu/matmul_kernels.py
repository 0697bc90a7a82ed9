"""Numba kernels for quantized weights: mat-vec / small-batch dot products that decode blocks in
registers (never writing a float copy of the weight), and row dequantization into a scratch buffer
(for get_rows and large-batch matmul through BLAS).

Every kernel is compiled on first use (``cache=True``), so a model only pays for its own types.
Conventions: ``w`` is the raw weight ``uint8[N, row_bytes]`` (C-contiguous), ``x`` the activations
``float32[M, K]``, ``xs`` a scratch ``float32[M, K // 32]`` the kernel fills with the sums of ``x``
over each 32 elements (the offsets/mins of the block formats fold into them), ``out`` is
``float32[M, N]`` and ``f16`` the 65536-entry half -> float table. Rows are processed four per pass
(sharing the activation block; Q6_K one) over 1-D row views; ``prange`` runs over groups of rows.

What made them fast (AVX2 VM, one thread, ``benchmarks/bench_matvec.py``):
- software prefetch of the rows ``PREFETCH_ROWS`` ahead: 2.2x on a 178 MB Q8_0 matrix;
- quant bits unpacked with ``fbits`` (32-bit integer ops; Numba's 64-bit ones vectorize in 4 lanes);
- high nibbles used in place (``q & 0xF0``) against ``x / 16``, one sum per block and row, and Q6_K's
  scales applied per element, so that few horizontal sums are left: 1.4-2x on Q4_x, Q5_x, K-quants.
"""

from __future__ import annotations

import numpy as np

from ..._numba import fbits, njit, prange, prefetch

F16_TABLE = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)

_F0 = np.float32(0.0)
_F16 = np.float32(16.0)
_F32 = np.float32(32.0)
_F4 = np.float32(4.0)
_Q = np.float32(0.25)
_S16 = np.float32(1.0 / 16.0)
_I15 = np.int32(15)
_I240 = np.int32(240)
_I63 = np.int32(63)
_I1 = np.int32(1)
_I2 = np.int32(2)
_I3 = np.int32(3)
_I4 = np.int32(4)
_I6 = np.int32(6)
_I12 = np.int32(12)
_I48 = np.int32(48)
_I192 = np.int32(192)
#: rows ahead of the current group whose bytes are prefetched (the hardware prefetcher alone leaves
#: a large mat-vec at ~40 % of the bus: measured 2.4x on 262144x640 Q8_0)
PREFETCH_ROWS = 16


@njit(inline="always")
def _h(w, o, f16):
    return f16[np.int64(w[o]) | (np.int64(w[o + 1]) << 8)]


@njit(inline="always")
def _pf(wf, p, nbytes, total):
    """Prefetch ``nbytes`` from flat offset ``p`` of the weight (skipped past its end)."""
    if p + nbytes <= total:
        for c in range(0, nbytes, 64):
            prefetch(wf, p + c)


@njit(inline="always")
def _xsums(x, xs):
    for m in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s


@njit(inline="always")
def _nib4(w0, w1, w2, w3, o, xm, x16, xl, xh, n):
    """For 4 rows: sum_j lo(w[o+j]) * x[xl+j] + hi(w[o+j]) * x[xh+j], j < n, where ``x16 = x / 16`` so
    that the high nibble is used in place (``q & 0xF0``) with no shift."""
    s0 = _F0
    s1 = _F0
    s2 = _F0
    s3 = _F0
    for j in range(n):
        a = xm[xl + j]
        b = x16[xh + j]
        q0 = w0[o + j]
        q1 = w1[o + j]
        q2 = w2[o + j]
        q3 = w3[o + j]
        s0 += fbits(q0, _I15) * a + fbits(q0, _I240) * b
        s1 += fbits(q1, _I15) * a + fbits(q1, _I240) * b
        s2 += fbits(q2, _I15) * a + fbits(q2, _I240) * b
        s3 += fbits(q3, _I15) * a + fbits(q3, _I240) * b
    return s0, s1, s2, s3


@njit(inline="always")
def _nib5(w0, w1, w2, w3, o, oh, xm, x16, xo, bits):
    """Q5_0/Q5_1 block for 4 rows: quants at ``o``, the 32 fifth bits at ``oh``; ``bits[byte]`` holds
    the 8 bits of a byte as 0.0 / 16.0 (8 KiB, stays in L1), so the fifth bits cost a load and an add."""
    s0 = _F0
    s1 = _F0
    s2 = _F0
    s3 = _F0
    for k in range(2):
        tl0 = bits[w0[oh + k]]
        tl1 = bits[w1[oh + k]]
        tl2 = bits[w2[oh + k]]
        tl3 = bits[w3[oh + k]]
        th0 = bits[w0[oh + 2 + k]]
        th1 = bits[w1[oh + 2 + k]]
        th2 = bits[w2[oh + 2 + k]]
        th3 = bits[w3[oh + 2 + k]]
        for j in range(8):
            i = 8 * k + j
            a = xm[xo + i]
            b = x16[xo + 16 + i]
            c = xm[xo + 16 + i]
            q0 = w0[o + i]
            q1 = w1[o + i]
            q2 = w2[o + i]
            q3 = w3[o + i]
            s0 += (fbits(q0, _I15) + tl0[j]) * a + fbits(q0, _I240) * b + th0[j] * c
            s1 += (fbits(q1, _I15) + tl1[j]) * a + fbits(q1, _I240) * b + th1[j] * c
            s2 += (fbits(q2, _I15) + tl2[j]) * a + fbits(q2, _I240) * b + th2[j] * c
            s3 += (fbits(q3, _I15) + tl3[j]) * a + fbits(q3, _I240) * b + th3[j] * c
    return s0, s1, s2, s3


_BIT = np.array([1 << i for i in range(8)], np.int32)
_BITF = np.array([16.0 / (1 << i) for i in range(8)], np.float32)
BITS16 = np.array([[16.0 * ((v >> j) & 1) for j in range(8)] for v in range(256)], np.float32)


@njit(inline="always")
def _x16(x):
    # a plain loop: an array expression here would become a parallel region of its own
    y = np.empty_like(x)
    for m in range(x.shape[0]):
        for k in range(x.shape[1]):
            y[m, k] = x[m, k] * _S16
    return y


@njit(inline="always")
def _nib4k(w0, w1, w2, w3, o, xm, x0):
    """K-quant 64-element chunk for 4 rows: low nibbles times x[x0:x0+32], high ones times
    x[x0+32:x0+64] (separate sums: the two halves have their own scales)."""
    l0 = _F0
    l1 = _F0
    l2 = _F0
    l3 = _F0
    h0 = _F0
    h1 = _F0
    h2 = _F0
    h3 = _F0
    for j in range(32):
        a = xm[x0 + j]
        b = xm[x0 + 32 + j]
        q0 = w0[o + j]
        q1 = w1[o + j]
        q2 = w2[o + j]
        q3 = w3[o + j]
        l0 += fbits(q0, _I15) * a
        l1 += fbits(q1, _I15) * a
        l2 += fbits(q2, _I15) * a
        l3 += fbits(q3, _I15) * a
        h0 += fbits(q0, _I240) * b
        h1 += fbits(q1, _I240) * b
        h2 += fbits(q2, _I240) * b
        h3 += fbits(q3, _I240) * b
    return l0, l1, l2, l3, h0 * _S16, h1 * _S16, h2 * _S16, h3 * _S16


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_0(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 18
    wf = w.reshape(-1)
    _xsums(x, xs)
    xs16 = _x16(x)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = w[r0]
        w1 = w[min(r0 + 1, N - 1)]  # the last group repeats its last row instead of a second code path
        w2 = w[min(r0 + 2, N - 1)]
        w3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 72, 72, N * rb)
                o = b * 18
                s0, s1, s2, s3 = _nib4(w0, w1, w2, w3, o + 2, xm, xs16[m], b * 32, b * 32 + 16, 16)
                c = np.float32(8.0) * xs[m, b]
                a0 += _h(w0, o, f16) * (s0 - c)
                a1 += _h(w1, o, f16) * (s1 - c)
                a2 += _h(w2, o, f16) * (s2 - c)
                a3 += _h(w3, o, f16) * (s3 - c)
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_1(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 20
    wf = w.reshape(-1)
    _xsums(x, xs)
    xs16 = _x16(x)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = w[r0]
        w1 = w[min(r0 + 1, N - 1)]
        w2 = w[min(r0 + 2, N - 1)]
        w3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 80, 80, N * rb)
                o = b * 20
                s0, s1, s2, s3 = _nib4(w0, w1, w2, w3, o + 4, xm, xs16[m], b * 32, b * 32 + 16, 16)
                c = xs[m, b]
                a0 += _h(w0, o, f16) * s0 + _h(w0, o + 2, f16) * c
                a1 += _h(w1, o, f16) * s1 + _h(w1, o + 2, f16) * c
                a2 += _h(w2, o, f16) * s2 + _h(w2, o + 2, f16) * c
                a3 += _h(w3, o, f16) * s3 + _h(w3, o + 2, f16) * c
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_0(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 22
    wf = w.reshape(-1)
    _xsums(x, xs)
    xs16 = _x16(x)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = w[r0]
        w1 = w[min(r0 + 1, N - 1)]
        w2 = w[min(r0 + 2, N - 1)]
        w3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 88, 88, N * rb)
                o = b * 22
                s0, s1, s2, s3 = _nib5(w0, w1, w2, w3, o + 6, o + 2, xm, xs16[m], b * 32, BITS16)
                c = _F16 * xs[m, b]
                a0 += _h(w0, o, f16) * (s0 - c)
                a1 += _h(w1, o, f16) * (s1 - c)
                a2 += _h(w2, o, f16) * (s2 - c)
                a3 += _h(w3, o, f16) * (s3 - c)
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_1(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 24
    wf = w.reshape(-1)
    _xsums(x, xs)
    xs16 = _x16(x)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = w[r0]
        w1 = w[min(r0 + 1, N - 1)]
        w2 = w[min(r0 + 2, N - 1)]
        w3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 96, 96, N * rb)
                o = b * 24
                s0, s1, s2, s3 = _nib5(w0, w1, w2, w3, o + 8, o + 4, xm, xs16[m], b * 32, BITS16)
                c = xs[m, b]
                a0 += _h(w0, o, f16) * s0 + _h(w0, o + 2, f16) * c
                a1 += _h(w1, o, f16) * s1 + _h(w1, o + 2, f16) * c
                a2 += _h(w2, o, f16) * s2 + _h(w2, o + 2, f16) * c
                a3 += _h(w3, o, f16) * s3 + _h(w3, o + 2, f16) * c
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(parallel=True, cache=True, fastmath=True)
def mm_q8_0(w, x, xs, out, f16):
    # four rows share one 32-long loop over 1-D row views, which LLVM vectorizes (int8 -> float, FMA
    # on ymm); a 2-D-indexed form compiled to byte inserts (vpinsrb) and ran 3-4x slower
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 34
    wi = w.view(np.int8)
    wf = w.reshape(-1)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = wi[r0]
        w1 = wi[min(r0 + 1, N - 1)]
        w2 = wi[min(r0 + 2, N - 1)]
        w3 = wi[min(r0 + 3, N - 1)]
        u0 = w[r0]
        u1 = w[min(r0 + 1, N - 1)]
        u2 = w[min(r0 + 2, N - 1)]
        u3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 136, 136, N * rb)
                o = b * 34 + 2
                xo = b * 32
                s0 = _F0
                s1 = _F0
                s2 = _F0
                s3 = _F0
                for j in range(32):
                    xv = xm[xo + j]
                    s0 += np.float32(w0[o + j]) * xv
                    s1 += np.float32(w1[o + j]) * xv
                    s2 += np.float32(w2[o + j]) * xv
                    s3 += np.float32(w3[o + j]) * xv
                a0 += _h(u0, o - 2, f16) * s0
                a1 += _h(u1, o - 2, f16) * s1
                a2 += _h(u2, o - 2, f16) * s2
                a3 += _h(u3, o - 2, f16) * s3
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(inline="always")
def _scale_min_k4(w, o, j):
    """6-bit scale and min ``j`` (0..7) of a Q4_K/Q5_K block whose scales start at ``o``."""
    if j < 4:
        return np.float32(np.int32(w[o + j]) & _I63), np.float32(np.int32(w[o + j + 4]) & _I63)
    a = np.int32(w[o + j + 4])
    sc = (a & _I15) | ((np.int32(w[o + j - 4]) >> _I6) << _I4)
    mn = (a >> _I4) | ((np.int32(w[o + j]) >> _I6) << _I4)
    return np.float32(sc), np.float32(mn)


@njit(inline="always")
def _k4_row(wr, o, d, dmin, c, l, h, xs, m, b):
    sc1, mn1 = _scale_min_k4(wr, o + 4, 2 * c)
    sc2, mn2 = _scale_min_k4(wr, o + 4, 2 * c + 1)
    return d * (sc1 * l + sc2 * h) - dmin * (mn1 * xs[m, b * 8 + 2 * c] + mn2 * xs[m, b * 8 + 2 * c + 1])


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_k(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 144
    wf = w.reshape(-1)
    _xsums(x, xs)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = w[r0]
        w1 = w[min(r0 + 1, N - 1)]
        w2 = w[min(r0 + 2, N - 1)]
        w3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 576, 576, N * rb)
                o = b * 144
                d0 = _h(w0, o, f16)
                d1 = _h(w1, o, f16)
                d2 = _h(w2, o, f16)
                d3 = _h(w3, o, f16)
                n0 = _h(w0, o + 2, f16)
                n1 = _h(w1, o + 2, f16)
                n2 = _h(w2, o + 2, f16)
                n3 = _h(w3, o + 2, f16)
                for c in range(4):
                    x0 = b * 256 + 64 * c
                    l0, l1, l2, l3, h0, h1, h2, h3 = _nib4k(w0, w1, w2, w3, o + 16 + 32 * c, xm, x0)
                    a0 += _k4_row(w0, o, d0, n0, c, l0, h0, xs, m, b)
                    a1 += _k4_row(w1, o, d1, n1, c, l1, h1, xs, m, b)
                    a2 += _k4_row(w2, o, d2, n2, c, l2, h2, xs, m, b)
                    a3 += _k4_row(w3, o, d3, n3, c, l3, h3, xs, m, b)
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(inline="always")
def _hb4k(w0, w1, w2, w3, o, bit, f, xm, xo):
    """Q5_K fifth bits for 4 rows: sum_j 16 * (w[o+j] & bit != 0) * x[xo+j], j < 32, as
    ``(w & bit) * f`` with ``f = 16 / bit`` (no shift, no select)."""
    s0 = _F0
    s1 = _F0
    s2 = _F0
    s3 = _F0
    for j in range(32):
        a = xm[xo + j]
        s0 += fbits(w0[o + j], bit) * a
        s1 += fbits(w1[o + j], bit) * a
        s2 += fbits(w2[o + j], bit) * a
        s3 += fbits(w3[o + j], bit) * a
    return s0 * f, s1 * f, s2 * f, s3 * f


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_k(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 176
    wf = w.reshape(-1)
    _xsums(x, xs)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        w0 = w[r0]
        w1 = w[min(r0 + 1, N - 1)]
        w2 = w[min(r0 + 2, N - 1)]
        w3 = w[min(r0 + 3, N - 1)]
        pf = (r0 + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 704, 704, N * rb)
                o = b * 176
                d0 = _h(w0, o, f16)
                d1 = _h(w1, o, f16)
                d2 = _h(w2, o, f16)
                d3 = _h(w3, o, f16)
                n0 = _h(w0, o + 2, f16)
                n1 = _h(w1, o + 2, f16)
                n2 = _h(w2, o + 2, f16)
                n3 = _h(w3, o + 2, f16)
                for c in range(4):
                    x0 = b * 256 + 64 * c
                    l0, l1, l2, l3, h0, h1, h2, h3 = _nib4k(w0, w1, w2, w3, o + 48 + 32 * c, xm, x0)
                    e0, e1, e2, e3 = _hb4k(w0, w1, w2, w3, o + 16, _BIT[2 * c], _BITF[2 * c], xm, x0)
                    f0, f1, f2, f3 = _hb4k(
                        w0, w1, w2, w3, o + 16, _BIT[2 * c + 1], _BITF[2 * c + 1], xm, x0 + 32
                    )
                    a0 += _k4_row(w0, o, d0, n0, c, l0 + e0, h0 + f0, xs, m, b)
                    a1 += _k4_row(w1, o, d1, n1, c, l1 + e1, h1 + f1, xs, m, b)
                    a2 += _k4_row(w2, o, d2, n2, c, l2 + e2, h2 + f2, xs, m, b)
                    a3 += _k4_row(w3, o, d3, n3, c, l3 + e3, h3 + f3, xs, m, b)
            out[m, min(r0 + 3, N - 1)] = a3
            out[m, min(r0 + 2, N - 1)] = a2
            out[m, min(r0 + 1, N - 1)] = a1
            out[m, r0] = a0


@njit(inline="always")
def _q6_half(wr, si, ql, qh, sc, xm, x0, half):
    """One row of Q6_K: 64 of a 128-element half (16 from each quarter), scales applied per element so
    that the four quarter sums share one accumulator (one horizontal sum instead of four)."""
    c1 = np.float32(si[sc + half])
    c2 = np.float32(si[sc + half + 2])
    c3 = np.float32(si[sc + half + 4])
    c4 = np.float32(si[sc + half + 6])
    s = _F0
    for jj in range(16):
        j = half * 16 + jj
        a = wr[ql + j]
        c = wr[ql + 32 + j]
        h = wr[qh + j]
        s += (
            (fbits(a, 15) + fbits(h, 3) * _F16 - _F32) * (c1 * xm[x0 + j])
            + (fbits(c, 15) + fbits(h, 12) * _F4 - _F32) * (c2 * xm[x0 + 32 + j])
            + (fbits(a, 240) * _S16 + fbits(h, 48) - _F32) * (c3 * xm[x0 + 64 + j])
            + (fbits(c, 240) * _S16 + fbits(h, 192) * _Q - _F32) * (c4 * xm[x0 + 96 + j])
        )
    return s


@njit(parallel=True, cache=True, fastmath=True)
def mm_q6_k(w, x, xs, out, f16):
    N, rb = w.shape
    M = x.shape[0]
    nb = rb // 210
    wf = w.reshape(-1)
    wi = w.view(np.int8)
    for g in prange(N):
        wr = w[g]
        si = wi[g]
        pf = (g + PREFETCH_ROWS) * rb
        for m in range(M):
            xm = x[m]
            acc = _F0
            for b in range(nb):
                if m == 0:
                    _pf(wf, pf + b * 210, 210, N * rb)
                o = b * 210
                blk = _F0
                for n in range(2):
                    ql = o + 64 * n
                    qh = o + 128 + 32 * n
                    sc = o + 192 + 8 * n
                    x0 = b * 256 + 128 * n
                    blk += _q6_half(wr, si, ql, qh, sc, xm, x0, 0) + _q6_half(wr, si, ql, qh, sc, xm, x0, 1)
                acc += _h(wr, o + 208, f16) * blk
            out[m, g] = acc


MATVEC = {
    "Q4_0": mm_q4_0, "Q4_1": mm_q4_1, "Q5_0": mm_q5_0, "Q5_1": mm_q5_1, "Q8_0": mm_q8_0,
    "Q4_K": mm_q4_k, "Q5_K": mm_q5_k, "Q6_K": mm_q6_k,
}  # fmt: skip
