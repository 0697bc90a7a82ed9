"""Small-batch mat-vec kernels for the k-quants (Q4_K, Q5_K, Q6_K): each 32-weight run of a row is
unpacked ONCE into 32 bytes and multiplied (``isimd.imadd``) with the 8-bit activations of up to four
rows, instead of being unpacked again for every row as in ``kquant_kernels``' one-row kernels.

Same arithmetic as those: the activations are quantized to Q8_K once per call (``quantize_rows_q8_k``),
integer sums per super-block, then per row ``acc + (d * d8) * sum`` and the mins (Q4_K, Q5_K) or the -32
offset (Q6_K) against the activations' byte sums. The integer sums are exact and the float steps are
the same operations in the same order, as ``simd``'s strict FMAs, so a row's result does not depend on
the other rows in the batch (tested bit for bit); against the one-row kernels (whose fast-math steps
LLVM may reorder) they differ in float rounding only (~1e-6 relative; Q6_K came out bit for bit
equal on the dev host).

A pass is one weight row against a group of four activation rows (two when at most two are left; the
last group repeats its last row): four integer and four float accumulators. ``prange`` over weight rows.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import (
    Q4_K_BYTES,
    Q4_K_DMIN,
    Q4_K_QS,
    Q4_K_SCALES,
    Q5_K_BYTES,
    Q5_K_DMIN,
    Q5_K_QH,
    Q5_K_QS,
    Q5_K_SCALES,
    Q6_K_BYTES,
    Q6_K_D,
    Q6_K_QH,
    Q6_K_SCALES,
)
from .batch_kernels import _group
from .isimd import bload, bnib, bq5, bq6, iadd, ib8, ikscales, ilane, iload, imadd, imadd2, imul, itof, izero
from .kquant_kernels import QK_K, _nan_rows, _q8k
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes
from .simd import vfma_strict, vhsum, vsplat, vzero


@njit(inline="always")
def _mins(acc, s, d, dmin, d8, mn, bsf, j):
    """One super-block's float steps for one activation row (``kquant_kernels._q4k_row``'s order)."""
    acc = vfma_strict(acc, vsplat(d * d8), itof(s))
    return vfma_strict(acc, vsplat(-dmin * d8), itof(imul(mn, iload(bsf, j))))


@njit(inline="always")
def _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full):
    if full:
        out[i3, r] = vhsum(a3)
        out[i2, r] = vhsum(a2)
    out[i1, r] = vhsum(a1)
    out[i0, r] = vhsum(a0)


# Written out per type, as in kquant_kernels (a shared body would compile every unpacker into each).
@njit(parallel=True, cache=True)
def mmb_q4_k(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q4_K_BYTES
    wf = w.reshape(-1)
    xq, xd, _, bs32, ok = _q8k(x)
    xqf, bsf, K = xq.reshape(-1), bs32.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            q0, q1, q2, q3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q4_K_BYTES, Q4_K_BYTES, N * rb)
                o, x0 = b * Q4_K_BYTES, b * QK_K
                sc, mn = ikscales(wr, o + Q4_K_SCALES)
                s0, s1, s2, s3 = izero(), izero(), izero(), izero()
                for c in range(4):
                    q = o + Q4_K_QS + 32 * c
                    xo = x0 + 64 * c
                    u, k = bnib(wr, q, False), ilane(sc, 2 * c)
                    s0 = imadd(s0, u, bload(xqf, q0 + xo), k)
                    s1 = imadd(s1, u, bload(xqf, q1 + xo), k)
                    if full:
                        s2 = imadd(s2, u, bload(xqf, q2 + xo), k)
                        s3 = imadd(s3, u, bload(xqf, q3 + xo), k)
                    u, k = bnib(wr, q, True), ilane(sc, 2 * c + 1)
                    s0 = imadd(s0, u, bload(xqf, q0 + xo + 32), k)
                    s1 = imadd(s1, u, bload(xqf, q1 + xo + 32), k)
                    if full:
                        s2 = imadd(s2, u, bload(xqf, q2 + xo + 32), k)
                        s3 = imadd(s3, u, bload(xqf, q3 + xo + 32), k)
                d, dmin = f16at(wr, o, f16), f16at(wr, o + Q4_K_DMIN, f16)
                a0 = _mins(a0, s0, d, dmin, xd[i0, b], mn, bsf, q0 // 32 + b * 8)
                a1 = _mins(a1, s1, d, dmin, xd[i1, b], mn, bsf, q1 // 32 + b * 8)
                if full:
                    a2 = _mins(a2, s2, d, dmin, xd[i2, b], mn, bsf, q2 // 32 + b * 8)
                    a3 = _mins(a3, s3, d, dmin, xd[i3, b], mn, bsf, q3 // 32 + b * 8)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
    _nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mmb_q5_k(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q5_K_BYTES
    wf = w.reshape(-1)
    xq, xd, _, bs32, ok = _q8k(x)
    xqf, bsf, K = xq.reshape(-1), bs32.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            q0, q1, q2, q3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q5_K_BYTES, Q5_K_BYTES, N * rb)
                o, x0 = b * Q5_K_BYTES, b * QK_K
                sc, mn = ikscales(wr, o + Q5_K_SCALES)
                qh = o + Q5_K_QH
                s0, s1, s2, s3 = izero(), izero(), izero(), izero()
                for c in range(4):
                    q = o + Q5_K_QS + 32 * c
                    xo = x0 + 64 * c
                    u, k = bq5(wr, q, False, qh, 2 * c), ilane(sc, 2 * c)
                    s0 = imadd(s0, u, bload(xqf, q0 + xo), k)
                    s1 = imadd(s1, u, bload(xqf, q1 + xo), k)
                    if full:
                        s2 = imadd(s2, u, bload(xqf, q2 + xo), k)
                        s3 = imadd(s3, u, bload(xqf, q3 + xo), k)
                    u, k = bq5(wr, q, True, qh, 2 * c + 1), ilane(sc, 2 * c + 1)
                    s0 = imadd(s0, u, bload(xqf, q0 + xo + 32), k)
                    s1 = imadd(s1, u, bload(xqf, q1 + xo + 32), k)
                    if full:
                        s2 = imadd(s2, u, bload(xqf, q2 + xo + 32), k)
                        s3 = imadd(s3, u, bload(xqf, q3 + xo + 32), k)
                d, dmin = f16at(wr, o, f16), f16at(wr, o + Q5_K_DMIN, f16)
                a0 = _mins(a0, s0, d, dmin, xd[i0, b], mn, bsf, q0 // 32 + b * 8)
                a1 = _mins(a1, s1, d, dmin, xd[i1, b], mn, bsf, q1 // 32 + b * 8)
                if full:
                    a2 = _mins(a2, s2, d, dmin, xd[i2, b], mn, bsf, q2 // 32 + b * 8)
                    a3 = _mins(a3, s3, d, dmin, xd[i3, b], mn, bsf, q3 // 32 + b * 8)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
    _nan_rows(out, ok)


@njit(inline="always")
def _q6_off(acc, s, d, d8, si, sc, bsf, b16):
    """One Q6_K super-block's float steps for one activation row (``kquant_kernels._q6k_row``'s order)."""
    off = iadd(imul(ib8(si, sc), iload(bsf, b16)), imul(ib8(si, sc + 8), iload(bsf, b16 + 8)))
    dd = d * d8
    acc = vfma_strict(acc, vsplat(dd), itof(s))
    return vfma_strict(acc, vsplat(np.float32(-32.0) * dd), itof(off))


@njit(parallel=True, cache=True)
def mmb_q6_k(w, x, out, f16):
    N, rb = w.shape
    M, nb = x.shape[0], rb // Q6_K_BYTES
    wf = w.reshape(-1)
    xq, xd, bs16, _, ok = _q8k(x)
    xqf, bsf, K = xq.reshape(-1), bs16.reshape(-1), x.shape[1]
    for r in prange(N):
        wr = w[r]
        si = wr.view(np.int8)
        pf = (r + PREFETCH_ROWS) * rb
        for m0 in range(0, M, 4):
            i0, i1, i2, i3, full = _group(m0, M)
            q0, q1, q2, q3 = i0 * K, i1 * K, i2 * K, i3 * K
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m0 == 0:
                    prefetch_bytes(wf, pf + b * Q6_K_BYTES, Q6_K_BYTES, N * rb)
                o, x0 = b * Q6_K_BYTES, b * QK_K
                s0, s1, s2, s3 = izero(), izero(), izero(), izero()
                for n in range(2):
                    ql = o + 64 * n
                    qh = o + Q6_K_QH + 32 * n
                    sc = o + Q6_K_SCALES + 8 * n
                    xb = x0 + 128 * n
                    for j in range(4):  # runs: ql / ql + 32, low / high nibbles, qh bits 2j, 2j + 1
                        u = bq6(wr, ql + 32 * (j & 1), j >= 2, qh, 2 * j)
                        k0, k1 = si[sc + 2 * j], si[sc + 2 * j + 1]
                        xo = xb + 32 * j
                        s0 = imadd2(s0, u, bload(xqf, q0 + xo), k0, k1)
                        s1 = imadd2(s1, u, bload(xqf, q1 + xo), k0, k1)
                        if full:
                            s2 = imadd2(s2, u, bload(xqf, q2 + xo), k0, k1)
                            s3 = imadd2(s3, u, bload(xqf, q3 + xo), k0, k1)
                d = f16at(wr, o + Q6_K_D, f16)
                sc, b16 = o + Q6_K_SCALES, x0 // 16
                a0 = _q6_off(a0, s0, d, xd[i0, b], si, sc, bsf, q0 // 16 + b16)
                a1 = _q6_off(a1, s1, d, xd[i1, b], si, sc, bsf, q1 // 16 + b16)
                if full:
                    a2 = _q6_off(a2, s2, d, xd[i2, b], si, sc, bsf, q2 // 16 + b16)
                    a3 = _q6_off(a3, s3, d, xd[i3, b], si, sc, bsf, q3 // 16 + b16)
            _store(out, r, i0, i1, i2, i3, a0, a1, a2, a3, full)
    _nan_rows(out, ok)
