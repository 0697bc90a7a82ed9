"""Runs of 32 weights as float registers, one small decode function per type (llamafile's per-type
``load()``): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL (one run per block) and IQ4_XS (eight per
256-weight block), for the float-activation loops of ``batch_template``.

``load(wr, o, s, f16, tab) -> blk``: run ``s`` of the block at byte ``o`` of the weight row ``wr``,
decoded once into registers (``tab``: the type's lookup table, ``BITS16`` for Q5, ``E8M0_HALF`` for MXFP4,
passed in from the kernel so that its address stays in a register): the quants as four ``F32x8`` (elements 0-7, 8-15, 16-23, 24-31; Q5: plus the fifth
bits as four more, 16.0 where set), the scale splatted, and the offset (8, 16) or the min.

How a block enters a row is one of a few shared functions:
- 2 to 4 rows (``batch4``), ``row(acc, blk, xf, i, xsf, j)``: the products of the unscaled quants with
  the row's 32 activations at ``xf[i:]``, then the scale, and the offset times the run's activation sum
  (``xsf[j:]``: 8 lanes) or the min times it; the order of the one-row kernels;
- 5 to 8 rows (``batch8``), ``scaled(blk) -> w0..w3``: the 32 weights as floats (``d * (q - 8)``,
  ``d * q + m``, ...), so that each row then costs four FMAs (``batch_template._acc8``).
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit
from ..quants.layouts import (
    IQ4_NL_QS,
    IQ4_XS_QS,
    IQ4_XS_SCALES_H,
    IQ4_XS_SCALES_L,
    Q4_0_QS,
    Q4_1_M,
    Q4_1_QS,
    Q5_0_QH,
    Q5_0_QS,
    Q5_1_M,
    Q5_1_QH,
    Q5_1_QS,
    Q8_0_QS,
)
from .batch_template import dot
from .iq4_kernels import vnl4
from .mxfp4_kernels import vfp4
from .rowgroups import f16at
from .simd import (
    u16at,
    vadd_strict,
    vfma_strict,
    vi8,
    vload,
    vmul,
    vmul_strict,
    vq4,
    vsplat,
    vsub,
    vsub_strict,
)

_F8 = np.float32(8.0)
_F16 = np.float32(16.0)
#: BITS16[8 * v + j] = 16.0 if bit j of the byte v is set: the fifth bits of 8 Q5_0/Q5_1 elements
#: as one vector load (8 KiB, stays in L1)
BITS16 = np.array([16.0 * ((v >> j) & 1) for v in range(256) for j in range(8)], np.float32)


# -- decoding: one function per type ------------------------------------------------------------------
@njit(inline="always")
def _nibs(wr, q):
    return vq4(wr, q, False), vq4(wr, q + 8, False), vq4(wr, q, True), vq4(wr, q + 8, True)


@njit(inline="always")
def _bits(wr, qh, b):
    return (
        vload(b, np.int64(wr[qh]) * 8),
        vload(b, np.int64(wr[qh + 1]) * 8),
        vload(b, np.int64(wr[qh + 2]) * 8),
        vload(b, np.int64(wr[qh + 3]) * 8),
    )


@njit(inline="always")
def q4_0(wr, o, s, f16, tab):
    q0, q1, q2, q3 = _nibs(wr, o + Q4_0_QS)
    return q0, q1, q2, q3, vsplat(f16at(wr, o, f16)), vsplat(_F8)


@njit(inline="always")
def q4_1(wr, o, s, f16, tab):
    q0, q1, q2, q3 = _nibs(wr, o + Q4_1_QS)
    return q0, q1, q2, q3, vsplat(f16at(wr, o, f16)), vsplat(f16at(wr, o + Q4_1_M, f16))


@njit(inline="always")
def q5_0(wr, o, s, f16, tab):
    q0, q1, q2, q3 = _nibs(wr, o + Q5_0_QS)
    h0, h1, h2, h3 = _bits(wr, o + Q5_0_QH, tab)
    return q0, q1, q2, q3, h0, h1, h2, h3, vsplat(f16at(wr, o, f16)), vsplat(_F16)


@njit(inline="always")
def q5_1(wr, o, s, f16, tab):
    q0, q1, q2, q3 = _nibs(wr, o + Q5_1_QS)
    h0, h1, h2, h3 = _bits(wr, o + Q5_1_QH, tab)
    return q0, q1, q2, q3, h0, h1, h2, h3, vsplat(f16at(wr, o, f16)), vsplat(f16at(wr, o + Q5_1_M, f16))


@njit(inline="always")
def q8_0(wr, o, s, f16, tab):
    q = o + Q8_0_QS
    return vi8(wr, q), vi8(wr, q + 8), vi8(wr, q + 16), vi8(wr, q + 24), vsplat(f16at(wr, o, f16))


@njit(inline="always")
def mxfp4(wr, o, s, f16, tab):
    q = o + 1
    d = vsplat(tab[wr[o]])
    return vfp4(wr, q, False), vfp4(wr, q + 8, False), vfp4(wr, q, True), vfp4(wr, q + 8, True), d


@njit(inline="always")
def iq4_nl(wr, o, s, f16, tab):
    u0, u1, u2, u3 = vnl4(wr, o + IQ4_NL_QS)
    return u0, u1, u2, u3, vsplat(f16at(wr, o, f16))


@njit(inline="always")
def iq4_xs(wr, o, s, f16, tab):
    dsb, sh = f16at(wr, o, f16), u16at(wr, o + IQ4_XS_SCALES_H)
    lo = (wr[o + IQ4_XS_SCALES_L + s // 2] >> (4 * (s % 2))) & 15
    d = vsplat(dsb * np.float32((lo | (((sh >> (2 * s)) & 3) << 4)) - 32))
    u0, u1, u2, u3 = vnl4(wr, o + IQ4_XS_QS + 16 * s)
    return u0, u1, u2, u3, d


# -- 2 to 4 rows: how a block enters a row's accumulator ----------------------------------------------
@njit(inline="always")
def row_scale(acc, blk, xf, i, xsf, j):
    """acc + d * (q . x)"""
    q0, q1, q2, q3, d = blk
    return vfma_strict(acc, d, dot(q0, q1, q2, q3, xf, i))


@njit(inline="always")
def row_off(acc, blk, xf, i, xsf, j):
    """acc + d * (q . x - c * sum(x))"""
    q0, q1, q2, q3, d, c = blk
    return vfma_strict(acc, d, vsub_strict(dot(q0, q1, q2, q3, xf, i), vmul_strict(vload(xsf, j), c)))


@njit(inline="always")
def row_min(acc, blk, xf, i, xsf, j):
    """acc + d * (q . x) + m * sum(x)"""
    q0, q1, q2, q3, d, mn = blk
    acc = vfma_strict(acc, d, dot(q0, q1, q2, q3, xf, i))
    return vfma_strict(acc, mn, vload(xsf, j))


@njit(inline="always")
def _dot5(q0, q1, q2, q3, h0, h1, h2, h3, xm, i):
    """As ``dot`` plus the fifth bits' products, the fifth bits as floats."""
    t = dot(q0, q1, q2, q3, xm, i)
    t = vfma_strict(t, h0, vload(xm, i))
    t = vfma_strict(t, h1, vload(xm, i + 8))
    t = vfma_strict(t, h2, vload(xm, i + 16))
    return vfma_strict(t, h3, vload(xm, i + 24))


@njit(inline="always")
def row_off5(acc, blk, xf, i, xsf, j):
    """Q5_0: acc + d * ((q + h) . x - 16 * sum(x)), q and h multiplied separately"""
    q0, q1, q2, q3, h0, h1, h2, h3, d, c = blk
    t = _dot5(q0, q1, q2, q3, h0, h1, h2, h3, xf, i)
    return vfma_strict(acc, d, vsub_strict(t, vmul_strict(vload(xsf, j), c)))


@njit(inline="always")
def row_min5(acc, blk, xf, i, xsf, j):
    """Q5_1: acc + d * ((q + h) . x) + m * sum(x)"""
    q0, q1, q2, q3, h0, h1, h2, h3, d, mn = blk
    acc = vfma_strict(acc, d, _dot5(q0, q1, q2, q3, h0, h1, h2, h3, xf, i))
    return vfma_strict(acc, mn, vload(xsf, j))


# -- 5 to 8 rows: the block's 32 weights as floats ----------------------------------------------------
@njit(inline="always")
def scaled_off(blk):
    """d * (q - c) (Q4_0)"""
    q0, q1, q2, q3, d, c = blk
    return vmul(d, vsub(q0, c)), vmul(d, vsub(q1, c)), vmul(d, vsub(q2, c)), vmul(d, vsub(q3, c))


@njit(inline="always")
def scaled_min(blk):
    """d * q + m (Q4_1)"""
    q0, q1, q2, q3, d, mn = blk
    return vfma_strict(mn, d, q0), vfma_strict(mn, d, q1), vfma_strict(mn, d, q2), vfma_strict(mn, d, q3)


@njit(inline="always")
def scaled_off5(blk):
    """d * (q + h - c) (Q5_0)"""
    q0, q1, q2, q3, h0, h1, h2, h3, d, c = blk
    return (
        vmul_strict(d, vsub_strict(vadd_strict(q0, h0), c)),
        vmul_strict(d, vsub_strict(vadd_strict(q1, h1), c)),
        vmul_strict(d, vsub_strict(vadd_strict(q2, h2), c)),
        vmul_strict(d, vsub_strict(vadd_strict(q3, h3), c)),
    )


@njit(inline="always")
def scaled_min5(blk):
    """d * (q + h) + m (Q5_1)"""
    q0, q1, q2, q3, h0, h1, h2, h3, d, mn = blk
    return (
        vfma_strict(mn, d, vadd_strict(q0, h0)),
        vfma_strict(mn, d, vadd_strict(q1, h1)),
        vfma_strict(mn, d, vadd_strict(q2, h2)),
        vfma_strict(mn, d, vadd_strict(q3, h3)),
    )


@njit(inline="always")
def scaled_strict(blk):
    """d * q, strict (Q8_0, MXFP4)"""
    q0, q1, q2, q3, d = blk
    return vmul_strict(d, q0), vmul_strict(d, q1), vmul_strict(d, q2), vmul_strict(d, q3)


@njit(inline="always")
def scaled(blk):
    """d * q (IQ4_NL, IQ4_XS)"""
    q0, q1, q2, q3, d = blk
    return vmul(d, q0), vmul(d, q1), vmul(d, q2), vmul(d, q3)
