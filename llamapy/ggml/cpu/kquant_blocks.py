"""The k-quants' 256-weight blocks for the 8-bit-activation loop of ``batch_template.kbatch4``: a few
small functions per type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; some shared), the arithmetic of the one-row
kernels (``kquant_kernels``, ``kquant_lo_kernels``).

- ``head(wr, o) -> h``: the scales the runs need, decoded once per block (6-bit scales and mins as
  integer lanes; Q3_K's 16 signed scales);
- ``runs(s0, s1, s2, s3, wr, o, h, xqf, q0, q1, q2, q3, x0, full)``: the block's eight runs of 32 bytes,
  each unpacked once and multiplied into the group's integer sums (``run4`` with ``madd``: one scale per
  run, Q4_K and Q5_K; ``madd2``: one per 16, the others), in the one-row kernels' order and loop shape;
- ``tail(wr, o, f16, h) -> t``: the float scales (and what else ``fin`` needs once per block);
- ``fin(acc, s, wr, o, t, d8, bsf, jb)``: a row's float steps of the block: ``acc + (d * d8) * s``
  and the mins (Q4_K, Q5_K: per 32 against the activations' byte sums; Q2_K: per 16) or the offset
  (Q3_K: -4, Q6_K: -32, times the 16-element scales and byte sums).

Q6_K's kernel passes the weight as ``int8`` (its scales are signed); the unpackers read raw bytes.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from ..quants.layouts import (
    Q2_K_D,
    Q2_K_DMIN,
    Q2_K_QS,
    Q2_K_SCALES,
    Q3_K_D,
    Q3_K_HMASK,
    Q3_K_QS,
    Q3_K_SCALES,
    Q4_K_DMIN,
    Q4_K_QS,
    Q4_K_SCALES,
    Q5_K_QH,
    Q5_K_QS,
    Q5_K_SCALES,
    Q6_K_D,
    Q6_K_QH,
    Q6_K_SCALES,
)
from .batch_template import run4
from .isimd import bload, bnib, bq5, bq6, iadd, ib8, ikscales, ilane, iload, imadd, imadd2, imul, itof
from .kquant_lo_kernels import bq2, bq3, inib8, iq3scales
from .rowgroups import f16at
from .simd import vfma_strict, vsplat

_M4 = np.float32(-4.0)
_M32 = np.float32(-32.0)


@njit(inline="always")
def madd(s, u, xqf, i, k0, k1):
    return imadd(s, u, bload(xqf, i), k0)


@njit(inline="always")
def madd2(s, u, xqf, i, k0, k1):
    return imadd2(s, u, bload(xqf, i), k0, k1)


# -- Q4_K, Q5_K: 6-bit scales and mins per 32 --------------------------------------------------------
@njit(inline="always")
def q4_k_head(wr, o):
    return ikscales(wr, o + Q4_K_SCALES)


@njit(inline="always")
def q4_k_runs(s0, s1, s2, s3, wr, o, h, xqf, q0, q1, q2, q3, x0, full):
    sc = h[0]
    for c in range(4):
        q, xo = o + Q4_K_QS + 32 * c, x0 + 64 * c
        k = ilane(sc, 2 * c)
        s0, s1, s2, s3 = run4(s0, s1, s2, s3, madd, bnib(wr, q, False), k, k, xqf, q0, q1, q2, q3, xo, full)
        k = ilane(sc, 2 * c + 1)
        s0, s1, s2, s3 = run4(
            s0, s1, s2, s3, madd, bnib(wr, q, True), k, k, xqf, q0, q1, q2, q3, xo + 32, full
        )
    return s0, s1, s2, s3


@njit(inline="always")
def q5_k_head(wr, o):
    return ikscales(wr, o + Q5_K_SCALES)


@njit(inline="always")
def q5_k_runs(s0, s1, s2, s3, wr, o, h, xqf, q0, q1, q2, q3, x0, full):
    sc, qh = h[0], o + Q5_K_QH
    for c in range(4):
        q, xo = o + Q5_K_QS + 32 * c, x0 + 64 * c
        u, k = bq5(wr, q, False, qh, 2 * c), ilane(sc, 2 * c)
        s0, s1, s2, s3 = run4(s0, s1, s2, s3, madd, u, k, k, xqf, q0, q1, q2, q3, xo, full)
        u, k = bq5(wr, q, True, qh, 2 * c + 1), ilane(sc, 2 * c + 1)
        s0, s1, s2, s3 = run4(s0, s1, s2, s3, madd, u, k, k, xqf, q0, q1, q2, q3, xo + 32, full)
    return s0, s1, s2, s3


@njit(inline="always")
def tail_mins(wr, o, f16, h):
    """d, dmin (bytes 0, 2 of Q4_K and Q5_K) and the mins"""
    return f16at(wr, o, f16), f16at(wr, o + Q4_K_DMIN, f16), h[1]


@njit(inline="always")
def fin_mins(acc, s, wr, o, t, d8, bsf, jb):
    """acc + (d * d8) * s - (dmin * d8) * (mins . byte sums per 32)"""
    d, dmin, mn = t
    acc = vfma_strict(acc, vsplat(d * d8), itof(s))
    return vfma_strict(acc, vsplat(-dmin * d8), itof(imul(mn, iload(bsf, jb))))


# -- Q2_K, Q3_K, Q6_K: scales per 16 -----------------------------------------------------------------
@njit(inline="always")
def _fin16(acc, s, dd, dm, v0, v1, bsf, j):
    """acc + dd * s + dm * (v . byte sums per 16)"""
    off = iadd(imul(v0, iload(bsf, j)), imul(v1, iload(bsf, j + 8)))
    acc = vfma_strict(acc, vsplat(dd), itof(s))
    return vfma_strict(acc, vsplat(dm), itof(off))


@njit(inline="always")
def no_head(wr, o):
    return 0


@njit(inline="always")
def q2_k_runs(s0, s1, s2, s3, wr, o, h, xqf, q0, q1, q2, q3, x0, full):
    sc = o + Q2_K_SCALES
    for n in range(2):
        q = o + Q2_K_QS + 32 * n
        for j in range(4):
            g = sc + 8 * n + 2 * j
            u, k0, k1 = bq2(wr, q, 2 * j), wr[g] & 15, wr[g + 1] & 15
            s0, s1, s2, s3 = run4(
                s0, s1, s2, s3, madd2, u, k0, k1, xqf, q0, q1, q2, q3, x0 + 128 * n + 32 * j, full
            )
    return s0, s1, s2, s3


@njit(inline="always")
def q2_k_tail(wr, o, f16, h):
    sc = o + Q2_K_SCALES
    return (
        f16at(wr, o + Q2_K_D, f16),
        f16at(wr, o + Q2_K_DMIN, f16),
        inib8(wr, sc, True),
        inib8(wr, sc + 8, True),
    )


@njit(inline="always")
def q2_k_fin(acc, s, wr, o, t, d8, bsf, jb):
    d, dmin, v0, v1 = t
    return _fin16(acc, s, d * d8, -dmin * d8, v0, v1, bsf, jb)


@njit(inline="always")
def q3_k_head(wr, o):
    return iq3scales(wr, o + Q3_K_SCALES)


@njit(inline="always")
def _q3_half(s0, s1, s2, s3, wr, q, hm, hb0, sv, xqf, q0, q1, q2, q3, xo, full):
    """The four runs of 32 of one Q3_K half (``kquant_lo_kernels._q3_half``)."""
    for j in range(4):
        u, k0, k1 = bq3(wr, q, 2 * j, hm, hb0 + j), ilane(sv, 2 * j), ilane(sv, 2 * j + 1)
        s0, s1, s2, s3 = run4(s0, s1, s2, s3, madd2, u, k0, k1, xqf, q0, q1, q2, q3, xo + 32 * j, full)
    return s0, s1, s2, s3


@njit(inline="always")
def q3_k_runs(s0, s1, s2, s3, wr, o, h, xqf, q0, q1, q2, q3, x0, full):
    hm = o + Q3_K_HMASK
    s0, s1, s2, s3 = _q3_half(s0, s1, s2, s3, wr, o + Q3_K_QS, hm, 0, h[0], xqf, q0, q1, q2, q3, x0, full)
    return _q3_half(s0, s1, s2, s3, wr, o + Q3_K_QS + 32, hm, 4, h[1], xqf, q0, q1, q2, q3, x0 + 128, full)


@njit(inline="always")
def q3_k_tail(wr, o, f16, h):
    return f16at(wr, o + Q3_K_D, f16), h[0], h[1]


@njit(inline="always")
def q3_k_fin(acc, s, wr, o, t, d8, bsf, jb):
    d, v0, v1 = t
    dd = d * d8
    return _fin16(acc, s, dd, _M4 * dd, v0, v1, bsf, jb)


@njit(inline="always")
def q6_k_runs(s0, s1, s2, s3, si, o, h, xqf, q0, q1, q2, q3, x0, full):
    for n in range(2):
        ql, qh, sc = o + 64 * n, o + Q6_K_QH + 32 * n, o + Q6_K_SCALES + 8 * n
        for j in range(4):  # runs: ql / ql + 32, low / high nibbles, qh bits 2j, 2j + 1
            u = bq6(si, ql + 32 * (j & 1), j >= 2, qh, 2 * j)
            s0, s1, s2, s3 = run4(
                s0, s1, s2, s3, madd2, u, si[sc + 2 * j], si[sc + 2 * j + 1],
                xqf, q0, q1, q2, q3, x0 + 128 * n + 32 * j, full,
            )  # fmt: skip
    return s0, s1, s2, s3


@njit(inline="always")
def q6_k_tail(si, o, f16, h):
    return f16at(si, o + Q6_K_D, f16)


@njit(inline="always")
def q6_k_fin(acc, s, si, o, t, d8, bsf, jb):
    """``si``: the row as int8 (signed scales)"""
    sc = o + Q6_K_SCALES
    off = iadd(imul(ib8(si, sc), iload(bsf, jb)), imul(ib8(si, sc + 8), iload(bsf, jb + 8)))
    dd = t * d8
    acc = vfma_strict(acc, vsplat(dd), itof(s))
    return vfma_strict(acc, vsplat(_M32 * dd), itof(off))
