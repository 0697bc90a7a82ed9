"""Q5_K weights repacked eight rows at a time, and their mat-vec kernel over Q8_K activations.

The Q5_K counterpart of ``q4k_x8_kernels`` (read its docstring first): the eight 32-bit lanes of a register
are eight rows, 4 activation bytes are broadcast, ``pmaddubsw`` multiplies them by 4 bytes of each row,
one ``pmaddwd`` applies the rows' sub-block scales, the mins are four ``pmaddwd`` per super-block and the
eight ``d`` (``dmin``) are one ``vcvtph2ps``.

One super-block of 8 rows (``X8_BYTES`` = 1440 bytes, the 8 x 176 of Q5_K plus 32): the rows' ``d`` (8
float16), their ``dmin`` (8 float16), the scales as bytes ``[sub-block j][row r]`` (64), the mins as bytes
``[pair p][row r][2]`` (64), the 1024 nibble bytes ``[chunk c][group g][row r][4]`` (bytes ``32c + 4g ..
32c + 4g + 3`` of row r's ``qs``, as Q4_K x8), then the 256 fifth-bit bytes ``[group g][row r][4]`` (bytes
``4g .. 4g + 3`` of row r's ``qh``: bit 2c is the fifth bit of the low nibble of chunk c, bit 2c + 1 of the
high one). The fifth bits stay packed (a byte per weight would read 1.53x the bytes per token); the kernel
merges them into the nibbles in registers (``isimd.bq5``: a shift, an and, an or per 32 bytes) and one
``qh`` load serves the four chunks.

16-bit sums: a 5-bit weight times a Q8_K byte is at most 31 x 127; ``pmaddubsw`` adds 2 per lane, and
a row's lane pair of a sub-block holds 32 products, 16 per lane = 62992 > 32767: so the products of 4
groups (8 per lane, at most 31496) are summed in 16 bits and each half-sub-block takes its own
``pmaddwd`` by the scales (two per sub-block, where Q4_K x8 needs one).

The integer sums per row and super-block are the plain kernel's (``kquant_kernels.mm_q5_k``), so the
result differs from it only in the order of the float additions.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import Q5_K_BYTES, Q5_K_QH, Q5_K_QS, Q5_K_SCALES
from .isimd import bq5, itof, izero
from .kquant_kernels import _nan_rows, _q8k
from .rowgroups import prefetch_bytes
from .simd import vfma, vmul, vsplat, vstore, vzero
from .x8simd import xadd16, xbcast4, xh8, xmaddubs, xmins, xscale, xzero16

QK_K = 256
#: bytes of one super-block of eight rows
X8_BYTES = 1440
X8_D, X8_DMIN, X8_SC, X8_MN, X8_QS, X8_QH = 0, 16, 32, 96, 160, 1184
#: row groups ahead to prefetch (into L2)
X8_PREFETCH_GROUPS = 2


@njit(inline="always")
def _scale_min(w, o, j):
    """Sub-block ``j``'s 6-bit scale and min of the Q5_K block at ``o`` (ggml's get_scale_min_k4)."""
    q = o + Q5_K_SCALES
    if j < 4:
        return w[q + j] & 63, w[q + j + 4] & 63
    return (w[q + j + 4] & 15) | ((w[q + j - 4] >> 6) << 4), (w[q + j + 4] >> 4) | ((w[q + j] >> 6) << 4)


@njit(cache=True)
def repack_x8(A, R):
    """Q5_K rows ``A`` (uint8[N, nb * 176], N a multiple of 8) into ``R`` (uint8[N // 8, nb * 1440]).
    One thread: bound by first-touch page faults, as ``q4k_x8_kernels.repack_x8``."""
    N, rb = A.shape
    nb = rb // Q5_K_BYTES
    A32 = A.view(np.uint32)
    A16 = A.view(np.uint16)
    R32 = R.view(np.uint32)
    R16 = R.view(np.uint16)
    for grp in range(N // 8):
        dst = R[grp]
        for b in range(nb):  # a whole 8-row block at a time: the destination stays in L1
            for r in range(8):
                row = grp * 8 + r
                w = A[row]
                o, t = b * Q5_K_BYTES, b * X8_BYTES
                R16[grp, (t + X8_D) // 2 + r] = A16[row, o // 2]
                R16[grp, (t + X8_DMIN) // 2 + r] = A16[row, o // 2 + 1]
                for j in range(8):
                    sc, mn = _scale_min(w, o, j)
                    dst[t + X8_SC + 8 * j + r] = sc
                    dst[t + X8_MN + 16 * (j // 2) + 2 * r + (j & 1)] = mn
                s32, d32 = (o + Q5_K_QS) // 4, (t + X8_QS) // 4 + r
                for k in range(32):
                    R32[grp, d32 + 8 * k] = A32[row, s32 + k]
                h32, e32 = (o + Q5_K_QH) // 4, (t + X8_QH) // 4 + r
                for k in range(8):
                    R32[grp, e32 + 8 * k] = A32[row, h32 + k]


@njit(parallel=True, cache=True)
def unpack_x8_rows(R, r0, r1, dst):
    """Rows ``r0`` .. ``r1`` of a repacked weight back in plain Q5_K bytes (``dst``: uint8[r1 - r0,
    nb * 176]), bit for bit the rows ``repack_x8`` was given."""
    nb = R.shape[1] // X8_BYTES
    R32 = R.view(np.uint32)
    R16 = R.view(np.uint16)
    D32 = dst.view(np.uint32)
    D16 = dst.view(np.uint16)
    g0 = r0 // 8
    for gi in prange((r1 + 7) // 8 - g0):
        g8 = g0 + gi
        src = R[g8]
        for b in range(nb):  # a whole 8-row block at a time: the source stays in L1
            for r in range(max(0, r0 - g8 * 8), min(8, r1 - g8 * 8)):
                i = g8 * 8 + r - r0
                w = dst[i]
                o, t = b * Q5_K_BYTES, b * X8_BYTES
                D16[i, o // 2] = R16[g8, (t + X8_D) // 2 + r]
                D16[i, o // 2 + 1] = R16[g8, (t + X8_DMIN) // 2 + r]
                q = o + Q5_K_SCALES
                for k in range(4):
                    sc_lo, sc_hi = src[t + X8_SC + 8 * k + r], src[t + X8_SC + 8 * (k + 4) + r]
                    mn_lo = src[t + X8_MN + 16 * (k // 2) + 2 * r + (k & 1)]
                    mn_hi = src[t + X8_MN + 16 * ((k + 4) // 2) + 2 * r + (k & 1)]
                    w[q + k] = sc_lo | ((sc_hi >> 4) << 6)
                    w[q + k + 4] = mn_lo | ((mn_hi >> 4) << 6)
                    w[q + k + 8] = (sc_hi & 15) | ((mn_hi & 15) << 4)
                s32, d32 = (t + X8_QS) // 4 + r, (o + Q5_K_QS) // 4
                for k in range(32):
                    D32[i, d32 + k] = R32[g8, s32 + 8 * k]
                e32, h32 = (t + X8_QH) // 4 + r, (o + Q5_K_QH) // 4
                for k in range(8):
                    D32[i, h32 + k] = R32[g8, e32 + 8 * k]


@njit(inline="always")
def _x8_chunk(isum, w, t, xq, x0, c):
    """``isum`` plus the scaled sums of chunk ``c`` (sub-blocks 2c, 2c + 1) of one super-block of eight
    rows. Called with ``c`` a constant (the four calls written out): the fifth-bit shifts are then
    immediates (a loop over ``c`` that LLVM keeps rolled shifts by a register and spills)."""
    for h in range(2):  # 4 groups per 16-bit sum (at most 8 x 31 x 127 per lane)
        slo = xzero16()
        shi = xzero16()
        for g in range(4 * h, 4 * h + 4):
            q, qh = t + X8_QS + 256 * c + 32 * g, t + X8_QH + 32 * g
            xo = x0 + 64 * c + 4 * g
            slo = xadd16(slo, xmaddubs(bq5(w, q, False, qh, 2 * c), xbcast4(xq, xo)))
            shi = xadd16(shi, xmaddubs(bq5(w, q, True, qh, 2 * c + 1), xbcast4(xq, xo + 32)))
        isum = xscale(isum, slo, w, t + X8_SC + 16 * c)
        isum = xscale(isum, shi, w, t + X8_SC + 16 * c + 8)
    return isum


@njit(inline="always")
def _x8_block(w, t, xq, x0, b32, bb):
    """The integer sums of one super-block (at ``t``) of eight rows: (scaled quant sums, min sums)."""
    isum = _x8_chunk(izero(), w, t, xq, x0, 0)
    isum = _x8_chunk(isum, w, t, xq, x0, 1)
    isum = _x8_chunk(isum, w, t, xq, x0, 2)
    isum = _x8_chunk(isum, w, t, xq, x0, 3)
    msum = izero()
    for p in range(4):
        lo = b32[bb + 2 * p] & 0xFFFF
        hi = b32[bb + 2 * p + 1] << 16
        msum = xmins(msum, w, t + X8_MN + 16 * p, np.int32(lo | hi))
    return isum, msum


@njit(parallel=True, cache=True)
def mm_q5_k_x8(R, x, out, f16):
    """out[m, :] = W @ dequantize(quantize(x[m], Q8_K)) for the repacked Q5_K weight ``R``
    (uint8[N // 8, nb * 1440]); ``f16`` is unused (kept for the ``MATVEC`` call shape)."""
    G, gb = R.shape
    nb = gb // X8_BYTES
    Rf = R.reshape(-1)
    total = G * gb
    xq, xd, bs16, bs32, ok = _q8k(x)
    for grp in prange(G):
        w = R[grp]
        pf = (grp + X8_PREFETCH_GROUPS) * gb
        for m in range(x.shape[0]):
            xqm, b32m = xq[m], bs32[m]
            acc = vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if m == 0:
                    prefetch_bytes(Rf, pf + t, X8_BYTES, total)
                isum, msum = _x8_block(w, t, xqm, b * QK_K, b32m, b * 8)
                acc = vfma(acc, vmul(xh8(w, t + X8_D), vsplat(xd[m, b])), itof(isum))
                acc = vfma(acc, vmul(xh8(w, t + X8_DMIN), vsplat(-xd[m, b])), itof(msum))
            vstore(out[m], grp * 8, acc)
    _nan_rows(out, ok)
