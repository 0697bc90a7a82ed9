"""Numba kernels for quantized weights: mat-vec / small-batch dot products that decode blocks in
registers (never writing a float copy of the weight), and row dequantization into a scratch buffer
(for get_rows and large-batch matmul through BLAS).

Every kernel is compiled on first use (``cache=True``), so a model only pays for its own types.
Conventions: ``w`` is the raw weight ``uint8[N, row_bytes]`` (C-contiguous), ``x`` the activations
``float32[M, K]``, ``xs`` a scratch ``float32[M, K // 32]`` the kernel fills with the sums of ``x``
over each 32 elements (the offsets/mins of the block formats fold into them), ``out`` is
``float32[M, N]`` and ``f16`` the 65536-entry half -> float table. Rows are processed four per pass
(sharing the activation block); ``prange`` runs over groups of rows.

Integer work stays in int32 (the ``_I*`` constants): an int64 in the inner loop would make LLVM
convert int64 -> float, which AVX2 cannot vectorize (measured: 3-4.5x slower).
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange

F16_TABLE = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)

_F0 = np.float32(0.0)
_I1 = np.int32(1)
_I2 = np.int32(2)
_I3 = np.int32(3)
_I4 = np.int32(4)
_I6 = np.int32(6)
_I8 = np.int32(8)
_I15 = np.int32(15)
_I16 = np.int32(16)
_I32 = np.int32(32)
_I63 = np.int32(63)


@njit(inline="always")
def _h(w, r, o, f16):
    return f16[np.int64(w[r, o]) | (np.int64(w[r, o + 1]) << 8)]


@njit(inline="always")
def _u32(w, r, o):
    return (
        np.int64(w[r, o])
        | (np.int64(w[r, o + 1]) << 8)
        | (np.int64(w[r, o + 2]) << 16)
        | (np.int64(w[r, o + 3]) << 24)
    )


@njit(inline="always")
def _scale_min_k4(w, r, o, j):
    """6-bit scale and min ``j`` (0..7) of a Q4_K/Q5_K block whose scales start at ``o``."""
    if j < 4:
        return np.float32(np.int32(w[r, o + j]) & _I63), np.float32(np.int32(w[r, o + j + 4]) & _I63)
    a = np.int32(w[r, o + j + 4])
    sc = (a & _I15) | ((np.int32(w[r, o + j - 4]) >> _I6) << _I4)
    mn = (a >> _I4) | ((np.int32(w[r, o + j]) >> _I6) << _I4)
    return np.float32(sc), np.float32(mn)


# -- per-block dot products (one row, one block) ------------------------------------------------------
@njit(cache=True)  # not inlined: measured 1.9x faster (AVX2 VM)
def _dot_q4_0(w, r, b, x, m, xs, f16):
    o = b * 18
    xo = b * 32
    s = _F0
    for j in range(32):  # one loop over the 32 elements: low nibbles, then high ones
        q = np.int32(w[r, o + 2 + (j & 15)]) >> (_I4 * np.int32(j >> 4))
        s += np.float32(q & _I15) * x[m, xo + j]
    return _h(w, r, o, f16) * (s - np.float32(8.0) * xs[m, b])


@njit(cache=True)  # not inlined: measured 1.9x faster (AVX2 VM)
def _dot_q4_1(w, r, b, x, m, xs, f16):
    o = b * 20
    xo = b * 32
    s = _F0
    for j in range(32):
        q = np.int32(w[r, o + 4 + (j & 15)]) >> (_I4 * np.int32(j >> 4))
        s += np.float32(q & _I15) * x[m, xo + j]
    return _h(w, r, o, f16) * s + _h(w, r, o + 2, f16) * xs[m, b]


@njit(inline="always")
def _dot_q5_0(w, r, b, x, m, xs, f16):
    o = b * 22
    xo = b * 32
    qh = np.int32(_u32(w, r, o + 2) & 0xFFFF)
    qh2 = np.int32(_u32(w, r, o + 2) >> 16)
    s = _F0
    for j in range(16):
        q = np.int32(w[r, o + 6 + j])
        lo = (q & _I15) | (((qh >> np.int32(j)) & _I1) << _I4)
        hi = (q >> _I4) | (((qh2 >> np.int32(j)) & _I1) << _I4)
        s += np.float32(lo) * x[m, xo + j] + np.float32(hi) * x[m, xo + 16 + j]
    return _h(w, r, o, f16) * (s - np.float32(16.0) * xs[m, b])


@njit(inline="always")
def _dot_q5_1(w, r, b, x, m, xs, f16):
    o = b * 24
    xo = b * 32
    qh = np.int32(_u32(w, r, o + 4) & 0xFFFF)
    qh2 = np.int32(_u32(w, r, o + 4) >> 16)
    s = _F0
    for j in range(16):
        q = np.int32(w[r, o + 8 + j])
        lo = (q & _I15) | (((qh >> np.int32(j)) & _I1) << _I4)
        hi = (q >> _I4) | (((qh2 >> np.int32(j)) & _I1) << _I4)
        s += np.float32(lo) * x[m, xo + j] + np.float32(hi) * x[m, xo + 16 + j]
    return _h(w, r, o, f16) * s + _h(w, r, o + 2, f16) * xs[m, b]


@njit(inline="always")
def _dot_q4_k(w, r, b, x, m, xs, f16):
    o = b * 144
    xo = b * 256
    d = _h(w, r, o, f16)
    dmin = _h(w, r, o + 2, f16)
    acc = _F0
    for c in range(4):
        q0 = o + 16 + 32 * c
        x0 = xo + 64 * c
        s1 = _F0
        s2 = _F0
        for j in range(32):
            q = np.int32(w[r, q0 + j])
            s1 += np.float32(q & _I15) * x[m, x0 + j]
            s2 += np.float32(q >> _I4) * x[m, x0 + 32 + j]
        sc1, mn1 = _scale_min_k4(w, r, o + 4, 2 * c)
        sc2, mn2 = _scale_min_k4(w, r, o + 4, 2 * c + 1)
        acc += d * (sc1 * s1 + sc2 * s2) - dmin * (
            mn1 * xs[m, b * 8 + 2 * c] + mn2 * xs[m, b * 8 + 2 * c + 1]
        )
    return acc


@njit(inline="always")
def _dot_q5_k(w, r, b, x, m, xs, f16):
    o = b * 176
    xo = b * 256
    d = _h(w, r, o, f16)
    dmin = _h(w, r, o + 2, f16)
    acc = _F0
    for c in range(4):
        q0 = o + 48 + 32 * c
        x0 = xo + 64 * c
        sh = np.int32(2 * c)
        s1 = _F0
        s2 = _F0
        for j in range(32):
            q = np.int32(w[r, q0 + j])
            h = np.int32(w[r, o + 16 + j]) >> sh
            s1 += np.float32((q & _I15) | ((h & _I1) << _I4)) * x[m, x0 + j]
            s2 += np.float32((q >> _I4) | ((h & _I2) << _I3)) * x[m, x0 + 32 + j]
        sc1, mn1 = _scale_min_k4(w, r, o + 4, 2 * c)
        sc2, mn2 = _scale_min_k4(w, r, o + 4, 2 * c + 1)
        acc += d * (sc1 * s1 + sc2 * s2) - dmin * (
            mn1 * xs[m, b * 8 + 2 * c] + mn2 * xs[m, b * 8 + 2 * c + 1]
        )
    return acc


@njit(inline="always")
def _dot_q6_k(w, wi, r, b, x, m, xs, f16):
    o = b * 210
    xo = b * 256
    acc = _F0
    for n in range(2):
        ql = o + 64 * n
        qh = o + 128 + 32 * n
        sc = o + 192 + 8 * n
        x0 = xo + 128 * n
        for half in range(2):
            s1 = _F0
            s2 = _F0
            s3 = _F0
            s4 = _F0
            for jj in range(16):
                j = half * 16 + jj
                a = np.int32(w[r, ql + j])
                c = np.int32(w[r, ql + 32 + j])
                h = np.int32(w[r, qh + j])
                s1 += np.float32(((a & _I15) | ((h & _I3) << _I4)) - _I32) * x[m, x0 + j]
                s2 += np.float32(((c & _I15) | (((h >> _I2) & _I3) << _I4)) - _I32) * x[m, x0 + 32 + j]
                s3 += np.float32(((a >> _I4) | (((h >> _I4) & _I3) << _I4)) - _I32) * x[m, x0 + 64 + j]
                s4 += np.float32(((c >> _I4) | (((h >> _I6) & _I3) << _I4)) - _I32) * x[m, x0 + 96 + j]
            acc += (
                np.float32(wi[r, sc + half]) * s1
                + np.float32(wi[r, sc + half + 2]) * s2
                + np.float32(wi[r, sc + half + 4]) * s3
                + np.float32(wi[r, sc + half + 6]) * s4
            )
    return _h(w, r, o + 208, f16) * acc


# -- mat-vec / small-batch kernels: out[m, r] = sum_k W[r, k] * x[m, k] ------------------------------
# (one per type, written out so that each compiles and caches on its own)


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_0(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 18
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q4_0(w, r0, b, x, m, xs, f16)
                a1 += _dot_q4_0(w, r1, b, x, m, xs, f16)
                a2 += _dot_q4_0(w, r2, b, x, m, xs, f16)
                a3 += _dot_q4_0(w, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_1(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 20
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q4_1(w, r0, b, x, m, xs, f16)
                a1 += _dot_q4_1(w, r1, b, x, m, xs, f16)
                a2 += _dot_q4_1(w, r2, b, x, m, xs, f16)
                a3 += _dot_q4_1(w, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_0(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 22
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q5_0(w, r0, b, x, m, xs, f16)
                a1 += _dot_q5_0(w, r1, b, x, m, xs, f16)
                a2 += _dot_q5_0(w, r2, b, x, m, xs, f16)
                a3 += _dot_q5_0(w, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_1(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 24
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q5_1(w, r0, b, x, m, xs, f16)
                a1 += _dot_q5_1(w, r1, b, x, m, xs, f16)
                a2 += _dot_q5_1(w, r2, b, x, m, xs, f16)
                a3 += _dot_q5_1(w, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q8_0(w, x, xs, out, f16):
    # Not through a per-block helper: four rows share one 32-long loop over 1-D row views, which LLVM
    # vectorizes (int8 -> float, FMA on ymm); the 2-D-indexed inlined form compiled to byte inserts
    # (vpinsrb) and ran 3-4x slower (AVX2 VM: 4864x896 1371 -> 361 us, one thread).
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 34
    wi = w.view(np.int8)
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        w0 = wi[r0]
        w1 = wi[r1]
        w2 = wi[r2]
        w3 = wi[r3]
        for m in range(M):
            xm = x[m]
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
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
                a0 += _h(w, r0, o - 2, f16) * s0
                a1 += _h(w, r1, o - 2, f16) * s1
                a2 += _h(w, r2, o - 2, f16) * s2
                a3 += _h(w, r3, o - 2, f16) * s3
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q4_k(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 144
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q4_k(w, r0, b, x, m, xs, f16)
                a1 += _dot_q4_k(w, r1, b, x, m, xs, f16)
                a2 += _dot_q4_k(w, r2, b, x, m, xs, f16)
                a3 += _dot_q4_k(w, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q5_k(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 176
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q5_k(w, r0, b, x, m, xs, f16)
                a1 += _dot_q5_k(w, r1, b, x, m, xs, f16)
                a2 += _dot_q5_k(w, r2, b, x, m, xs, f16)
                a3 += _dot_q5_k(w, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


@njit(parallel=True, cache=True, fastmath=True)
def mm_q6_k(w, x, xs, out, f16):
    N = w.shape[0]
    M = x.shape[0]
    nb = w.shape[1] // 210
    wi = w.view(np.int8)
    for m in range(M):  # per-32 sums of x; serial, before the fork
        for b in range(x.shape[1] // 32):
            s = _F0
            for j in range(32):
                s += x[m, b * 32 + j]
            xs[m, b] = s
    for g in prange((N + 3) // 4):
        r0 = g * 4
        r1 = min(r0 + 1, N - 1)  # the last group repeats its last row instead of a second code path
        r2 = min(r0 + 2, N - 1)
        r3 = min(r0 + 3, N - 1)
        for m in range(M):
            a0 = _F0
            a1 = _F0
            a2 = _F0
            a3 = _F0
            for b in range(nb):
                a0 += _dot_q6_k(w, wi, r0, b, x, m, xs, f16)
                a1 += _dot_q6_k(w, wi, r1, b, x, m, xs, f16)
                a2 += _dot_q6_k(w, wi, r2, b, x, m, xs, f16)
                a3 += _dot_q6_k(w, wi, r3, b, x, m, xs, f16)
            out[m, r0] = a0
            out[m, r1] = a1
            out[m, r2] = a2
            out[m, r3] = a3


MATVEC = {
    "Q4_0": mm_q4_0, "Q4_1": mm_q4_1, "Q5_0": mm_q5_0, "Q5_1": mm_q5_1, "Q8_0": mm_q8_0,
    "Q4_K": mm_q4_k, "Q5_K": mm_q5_k, "Q6_K": mm_q6_k,
}  # fmt: skip
