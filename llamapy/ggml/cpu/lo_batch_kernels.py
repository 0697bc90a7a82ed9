"""Small-batch mat-vec kernels (2 to ``MATVEC_MAX_TOKENS`` rows) for Q2_K, Q3_K (``kquant_lo_kernels``)
and IQ4_NL, IQ4_XS (``iq4_kernels``): each weight run is unpacked once and used for up to four activation
rows, as ``kquant_batch`` (k-quants: 32 bytes per run, 8-bit activations quantized once per call) and
``batch_kernels`` (float activations: four ``F32x8`` per 32 weights) do for the other types.

A pass is one weight row against a group of four activation rows (two when at most two are left; the
last group repeats its last row); ``prange`` over weight rows. The float steps are ``simd``'s strict
operations, so a row's result does not depend on the other rows in the batch (tested bit for bit);
against the one-row kernels they differ in float rounding only.

Call as ``MATVEC``: ``kern(w, x, out, f16)``.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import (
    IQ4_NL_BYTES,
    IQ4_NL_QS,
    IQ4_XS_BYTES,
    IQ4_XS_QS,
    IQ4_XS_SCALES_H,
    IQ4_XS_SCALES_L,
    Q2_K_BYTES,
    Q2_K_D,
    Q2_K_DMIN,
    Q2_K_QS,
    Q2_K_SCALES,
    Q3_K_BYTES,
    Q3_K_D,
    Q3_K_HMASK,
    Q3_K_QS,
    Q3_K_SCALES,
)
from .batch_kernels import _dot, _group
from .iq4_kernels import vnl4
from .isimd import bload, iadd, ilane, iload, imadd2, imul, itof, izero
from .kquant_batch import _store
from .kquant_kernels import QK_K, _nan_rows, _q8k
from .kquant_lo_kernels import bq2, bq3, inib8, iq3scales
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes
from .simd import u16at, vfma_strict, vsplat, vzero


@njit(inline="always")
def _fin(acc, s, dd, dm, v0, v1, bsf, j):
    """One super-block's float steps for one activation row: ``acc + dd * s + dm * (v . byte sums)``
    (``kquant_lo_kernels``' row functions' order)."""
    off = iadd(imul(v0, iload(bsf, j)), imul(v1, iload(bsf, j + 8)))
    acc = vfma_strict(acc, vsplat(dd), itof(s))
    return vfma_strict(acc, vsplat(dm), itof(off))


@njit(parallel=True, cache=True)
def mmb_q2_k(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q2_K_BYTES
    wf = w.reshape(-1)
    xq, xd, bs16, _, ok = _q8k(x)
    xqf, bsf, K = xq.reshape(-1), bs16.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            q0, q1, q2, q3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q2_K_BYTES, Q2_K_BYTES, N * rb)
                o, x0 = b * Q2_K_BYTES, b * QK_K
                sc = o + Q2_K_SCALES
                s0, s1, s2, s3 = izero(), izero(), izero(), izero()
                for n in range(2):
                    q = o + Q2_K_QS + 32 * n
                    for j in range(4):
                        g = sc + 8 * n + 2 * j
                        u, k0, k1 = bq2(wr, q, 2 * j), wr[g] & 15, wr[g + 1] & 15
                        xo = x0 + 128 * n + 32 * j
                        s0 = imadd2(s0, u, bload(xqf, q0 + xo), k0, k1)
                        s1 = imadd2(s1, u, bload(xqf, q1 + xo), k0, k1)
                        if full:
                            s2 = imadd2(s2, u, bload(xqf, q2 + xo), k0, k1)
                            s3 = imadd2(s3, u, bload(xqf, q3 + xo), k0, k1)
                d, dmin = f16at(wr, o + Q2_K_D, f16), f16at(wr, o + Q2_K_DMIN, f16)
                v0, v1 = inib8(wr, sc, True), inib8(wr, sc + 8, True)
                j16 = x0 // 16
                a0 = _fin(a0, s0, d * xd[i0, b], -dmin * xd[i0, b], v0, v1, bsf, q0 // 16 + j16)
                a1 = _fin(a1, s1, d * xd[i1, b], -dmin * xd[i1, b], v0, v1, bsf, q1 // 16 + j16)
                if full:
                    a2 = _fin(a2, s2, d * xd[i2, b], -dmin * xd[i2, b], v0, v1, bsf, q2 // 16 + j16)
                    a3 = _fin(a3, s3, d * xd[i3, b], -dmin * xd[i3, b], v0, v1, bsf, q3 // 16 + j16)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
    _nan_rows(out, ok)


@njit(inline="always")
def _q3b_half(s0, s1, s2, s3, wr, q, hm, hb0, sv, xqf, q0, q1, q2, q3, xo, full):
    """The four runs of 32 of one Q3_K half (``kquant_lo_kernels._q3_half``) for a group of rows."""
    for j in range(4):
        u, k0, k1 = bq3(wr, q, 2 * j, hm, hb0 + j), ilane(sv, 2 * j), ilane(sv, 2 * j + 1)
        x = xo + 32 * j
        s0 = imadd2(s0, u, bload(xqf, q0 + x), k0, k1)
        s1 = imadd2(s1, u, bload(xqf, q1 + x), k0, k1)
        if full:
            s2 = imadd2(s2, u, bload(xqf, q2 + x), k0, k1)
            s3 = imadd2(s3, u, bload(xqf, q3 + x), k0, k1)
    return s0, s1, s2, s3


@njit(parallel=True, cache=True)
def mmb_q3_k(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q3_K_BYTES
    wf = w.reshape(-1)
    xq, xd, bs16, _, ok = _q8k(x)
    xqf, bsf, K = xq.reshape(-1), bs16.reshape(-1), x.shape[1]
    m4 = np.float32(-4.0)
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            q0, q1, q2, q3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q3_K_BYTES, Q3_K_BYTES, N * rb)
                o, x0 = b * Q3_K_BYTES, b * QK_K
                v0, v1 = iq3scales(wr, o + Q3_K_SCALES)
                hm = o + Q3_K_HMASK
                z = izero()
                s0, s1, s2, s3 = _q3b_half(
                    z, z, z, z, wr, o + Q3_K_QS, hm, 0, v0, xqf, q0, q1, q2, q3, x0, full
                )
                s0, s1, s2, s3 = _q3b_half(
                    s0, s1, s2, s3, wr, o + Q3_K_QS + 32, hm, 4, v1, xqf, q0, q1, q2, q3, x0 + 128, full
                )
                d = f16at(wr, o + Q3_K_D, f16)
                j16 = x0 // 16
                dd0, dd1, dd2, dd3 = d * xd[i0, b], d * xd[i1, b], d * xd[i2, b], d * xd[i3, b]
                a0 = _fin(a0, s0, dd0, m4 * dd0, v0, v1, bsf, q0 // 16 + j16)
                a1 = _fin(a1, s1, dd1, m4 * dd1, v0, v1, bsf, q1 // 16 + j16)
                if full:
                    a2 = _fin(a2, s2, dd2, m4 * dd2, v0, v1, bsf, q2 // 16 + j16)
                    a3 = _fin(a3, s3, dd3, m4 * dd3, v0, v1, bsf, q3 // 16 + j16)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
    _nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mmb_iq4_nl(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // IQ4_NL_BYTES
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
                    prefetch_bytes(wf, pf + b * IQ4_NL_BYTES, IQ4_NL_BYTES, N * rb)
                o, i = b * IQ4_NL_BYTES, b * 32
                q = o + IQ4_NL_QS
                u0, u1, u2, u3 = vnl4(wr, q)
                d = vsplat(f16at(wr, o, f16))
                a0 = vfma_strict(a0, d, _dot(u0, u1, u2, u3, xf, x0 + i))
                a1 = vfma_strict(a1, d, _dot(u0, u1, u2, u3, xf, x1 + i))
                if full:
                    a2 = vfma_strict(a2, d, _dot(u0, u1, u2, u3, xf, x2 + i))
                    a3 = vfma_strict(a3, d, _dot(u0, u1, u2, u3, xf, x3 + i))
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)


@njit(parallel=True, cache=True)
def mmb_iq4_xs(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // IQ4_XS_BYTES
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
                    prefetch_bytes(wf, pf + b * IQ4_XS_BYTES, IQ4_XS_BYTES, N * rb)
                o = b * IQ4_XS_BYTES
                dsb, sh = f16at(wr, o, f16), u16at(wr, o + IQ4_XS_SCALES_H)
                for ib in range(8):
                    lo = (wr[o + IQ4_XS_SCALES_L + ib // 2] >> (4 * (ib % 2))) & 15
                    d = vsplat(dsb * np.float32((lo | (((sh >> (2 * ib)) & 3) << 4)) - 32))
                    q, i = o + IQ4_XS_QS + 16 * ib, b * 256 + 32 * ib
                    u0, u1, u2, u3 = vnl4(wr, q)
                    a0 = vfma_strict(a0, d, _dot(u0, u1, u2, u3, xf, x0 + i))
                    a1 = vfma_strict(a1, d, _dot(u0, u1, u2, u3, xf, x1 + i))
                    if full:
                        a2 = vfma_strict(a2, d, _dot(u0, u1, u2, u3, xf, x2 + i))
                        a3 = vfma_strict(a3, d, _dot(u0, u1, u2, u3, xf, x3 + i))
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
