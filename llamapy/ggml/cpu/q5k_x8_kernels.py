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

``mm_q5_k_x8r4`` takes four activation rows per pass over the weight (prompts): each 32 weight bytes are
decoded (nibbles and fifth bits) once for the four rows, whose 16-bit sums run a quarter chunk (4 groups
of one nibble half) at a time so that four of them, the four scaled sums and the decoded bytes stay in
registers. Between quarters the four 32-bit sums pass through ``isimd.ibar4`` (an empty ``asm``):
without it LLVM interleaved the sixteen unrolled quarters of a super-block and spilled (413 stack moves in
the kernel's assembly, 81 with it; the same bits), and the kernel ran 1.3-1.8x slower (2 threads, 256
rows, haswell: 8960x1536 62-74 ms -> 46-54, 1536x8960 62-91 -> 48-50; Qwen2.5-1.5B-shaped Q5_K_M pp512
70-79 -> 100 t/s, alternating processes).
Each row's integer sums and float steps are ``mm_q5_k_x8``'s, so its result is too, bit for
bit: the float step (``_x8_step``) is written without fast-math flags, in the order LLVM had compiled the
one-row kernel's fast-math ``vfma(acc, vmul(d, xd), isum)`` (its results are unchanged bit for bit on
random weights, checked), so that it cannot be folded differently into the two kernels.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import Q5_K_BYTES, Q5_K_QH, Q5_K_QS, Q5_K_SCALES
from .hsimd import nan_rows
from .isimd import bq5, ibar4, itof, izero
from .kquant_kernels import _q8k
from .rowgroups import prefetch_bytes, x8_group_prefetch, x8_prefetch_from, x8_rows
from .simd import vfma_strict, vmul_strict, vsplat, vstore, vzero
from .x8simd import xadd16, xbcast4, xh8, xmaddubs, xmins, xscale, xzero16

QK_K = 256
#: bytes of one super-block of eight rows
X8_BYTES = 1440
X8_D, X8_DMIN, X8_SC, X8_MN, X8_QS, X8_QH = 0, 16, 32, 96, 160, 1184


@njit(inline="always")
def _scale_min(w, o, j):
    """Sub-block ``j``'s 6-bit scale and min of the Q5_K block at ``o`` (ggml's get_scale_min_k4)."""
    q = o + Q5_K_SCALES
    if j < 4:
        return w[q + j] & 63, w[q + j + 4] & 63
    return (w[q + j + 4] & 15) | ((w[q + j - 4] >> 6) << 4), (w[q + j + 4] >> 4) | ((w[q + j] >> 6) << 4)


@njit(parallel=True, cache=True)
def repack_x8(A, R):
    """Q5_K rows ``A`` (uint8[N, nb * 176], N a multiple of 8) into ``R`` (uint8[N // 8, nb * 1440]).
    One group of eight rows per ``prange`` item (disjoint writes). Each plain block
    is a slice indexed by the loop counters alone (LLVM then sees every offset non-negative and constant
    within the block): one thread, in cache (``benchmarks/repack_speed.py``), 2048x1536 0.30-0.49 -> 0.21-0.28
    ms, 1536x8960 1.4-1.8 -> 1.1-1.3 ms against row offsets; the same bytes."""
    N, rb = A.shape
    nb = rb // Q5_K_BYTES
    A32 = A.view(np.uint32)
    R32 = R.view(np.uint32)
    for grp in prange(N // 8):
        for b in range(nb):  # a whole 8-row block at a time: the destination stays in L1
            o, t = b * Q5_K_BYTES, b * X8_BYTES
            out = R[grp, t : t + X8_BYTES]
            o32 = R32[grp, t // 4 : (t + X8_BYTES) // 4]
            for r in range(8):
                w = A[grp * 8 + r, o : o + Q5_K_BYTES]
                b32 = A32[grp * 8 + r, o // 4 : (o + Q5_K_BYTES) // 4]
                for i in range(2):
                    out[X8_D + 2 * r + i] = w[i]
                    out[X8_DMIN + 2 * r + i] = w[2 + i]
                for j in range(8):
                    sc, mn = _scale_min(w, 0, j)
                    out[X8_SC + 8 * j + r] = sc
                    out[X8_MN + 16 * (j // 2) + 2 * r + (j & 1)] = mn
                for k in range(32):
                    o32[X8_QS // 4 + r + 8 * k] = b32[Q5_K_QS // 4 + k]
                for k in range(8):
                    o32[X8_QH // 4 + r + 8 * k] = b32[Q5_K_QH // 4 + k]


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
def _x8_mins(w, t, b32, bb):
    """The min sums of one super-block (at ``t``) of eight rows against the activations' per-32 sums
    ``b32`` from ``bb``."""
    msum = izero()
    for p in range(4):
        lo = b32[bb + 2 * p] & 0xFFFF
        hi = b32[bb + 2 * p + 1] << 16
        msum = xmins(msum, w, t + X8_MN + 16 * p, np.int32(lo | hi))
    return msum


@njit(inline="always")
def _x8_block(w, t, xq, x0, b32, bb):
    """The integer sums of one super-block (at ``t``) of eight rows: (scaled quant sums, min sums)."""
    isum = _x8_chunk(izero(), w, t, xq, x0, 0)
    isum = _x8_chunk(isum, w, t, xq, x0, 1)
    isum = _x8_chunk(isum, w, t, xq, x0, 2)
    isum = _x8_chunk(isum, w, t, xq, x0, 3)
    return isum, _x8_mins(w, t, b32, bb)


@njit(inline="always")
def _x8_step(acc, d, dm, xd, isum, msum):
    """``acc + xd * (d * isum) - xd * (dmin * msum)``: the rows' float step of one super-block, written
    without fast-math flags so that LLVM cannot fold it differently into the one-row and four-row
    kernels."""
    acc = vfma_strict(acc, vsplat(xd), vmul_strict(d, itof(isum)))
    return vfma_strict(acc, vsplat(-xd), vmul_strict(dm, itof(msum)))


@njit(parallel=True, cache=True)
def mm_q5_k_x8(R, x, out, pfd, nth=2):
    """out[m, :] = W @ dequantize(quantize(x[m], Q8_K)) for the repacked Q5_K weight ``R``
    (uint8[N // 8, nb * 1440]); ``pfd``: the prefetch distance (``rowgroups.x8_prefetch_from``)."""
    xq, xd, bs16, bs32, ok = _q8k(x)
    x8_rows(R, out, x.shape[0], pfd, nth, X8_BYTES, _x8_row_block, x8_group_prefetch, (xq, xd, bs32))
    nan_rows(out, ok)


@njit(inline="always")
def _x8_row_block(acc, w, t, m, b, a):
    """``rowgroups.x8_rows``' block: activation row ``m``'s step of super-block ``b``."""
    xq, xd, bs32 = a
    isum, msum = _x8_block(w, t, xq[m], b * QK_K, bs32[m], b * 8)
    return _x8_step(acc, xh8(w, t + X8_D), xh8(w, t + X8_DMIN), xd[m, b], isum, msum)


@njit(inline="always")
def _quarter4(i0, i1, i2, i3, w, t, hi, x0, x1, x2, x3, xo, c, h):
    """Groups ``4h .. 4h + 3`` of the low (``hi`` False) or high nibbles of chunk ``c`` (a constant)
    against four activation rows (at ``xo``): each 32 weight bytes decoded once for all four, each
    row's 16-bit sum (8 products a lane at most, as ``_x8_chunk``) scaled into its ``i``."""
    s0, s1, s2, s3 = xzero16(), xzero16(), xzero16(), xzero16()
    for g in range(4 * h, 4 * h + 4):
        v = bq5(w, t + X8_QS + 256 * c + 32 * g, hi, t + X8_QH + 32 * g, 2 * c + hi)
        o = xo + 4 * g
        s0 = xadd16(s0, xmaddubs(v, xbcast4(x0, o)))
        s1 = xadd16(s1, xmaddubs(v, xbcast4(x1, o)))
        s2 = xadd16(s2, xmaddubs(v, xbcast4(x2, o)))
        s3 = xadd16(s3, xmaddubs(v, xbcast4(x3, o)))
    k = t + X8_SC + 16 * c + 8 * hi
    return xscale(i0, s0, w, k), xscale(i1, s1, w, k), xscale(i2, s2, w, k), xscale(i3, s3, w, k)


@njit(inline="always")
def _chunk4(i0, i1, i2, i3, w, t, x0, x1, x2, x3, xo, c):
    """``_x8_chunk`` for four activation rows (``c`` a constant: the fifth-bit shifts immediates)."""
    o = xo + 64 * c
    i0, i1, i2, i3 = _quarter4(i0, i1, i2, i3, w, t, False, x0, x1, x2, x3, o, c, 0)
    i0, i1, i2, i3 = ibar4(i0, i1, i2, i3)
    i0, i1, i2, i3 = _quarter4(i0, i1, i2, i3, w, t, True, x0, x1, x2, x3, o + 32, c, 0)
    i0, i1, i2, i3 = ibar4(i0, i1, i2, i3)
    i0, i1, i2, i3 = _quarter4(i0, i1, i2, i3, w, t, False, x0, x1, x2, x3, o, c, 1)
    i0, i1, i2, i3 = ibar4(i0, i1, i2, i3)
    i0, i1, i2, i3 = _quarter4(i0, i1, i2, i3, w, t, True, x0, x1, x2, x3, o + 32, c, 1)
    return ibar4(i0, i1, i2, i3)


@njit(inline="always")
def _x8_sums4(w, t, x0, x1, x2, x3, xo):
    """The scaled quant sums of ``_x8_block`` for four activation rows (the same integer sums per row:
    only the order of exact integer additions differs)."""
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    i0, i1, i2, i3 = _chunk4(i0, i1, i2, i3, w, t, x0, x1, x2, x3, xo, 0)
    i0, i1, i2, i3 = _chunk4(i0, i1, i2, i3, w, t, x0, x1, x2, x3, xo, 1)
    i0, i1, i2, i3 = _chunk4(i0, i1, i2, i3, w, t, x0, x1, x2, x3, xo, 2)
    return _chunk4(i0, i1, i2, i3, w, t, x0, x1, x2, x3, xo, 3)


@njit(parallel=True, cache=True)
def mm_q5_k_x8r4(R, x, out, pfd):
    """As ``mm_q5_k_x8``, four activation rows per pass over the weight (prompts): each row's result is
    the one-row kernel's, bit for bit. The last ``M % 4`` rows: three run as a pass of four (the last row
    repeated), one or two one at a time."""
    G, gb = R.shape
    nb = gb // X8_BYTES
    M = x.shape[0]
    full = M if M % 4 == 3 else M - M % 4
    Rf = R.reshape(-1)
    total = G * gb
    xq, xd, bs16, bs32, ok = _q8k(x)
    for grp in prange(G):
        w = R[grp]
        pf = x8_prefetch_from(grp, gb, pfd)
        for m0 in range(0, full, 4):
            m1, m2, m3 = m0 + 1, m0 + 2, min(m0 + 3, M - 1)
            x0, x1, x2, x3 = xq[m0], xq[m1], xq[m2], xq[m3]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if m0 == 0:
                    prefetch_bytes(Rf, pf + t, X8_BYTES, total)
                i0, i1, i2, i3 = _x8_sums4(w, t, x0, x1, x2, x3, b * QK_K)
                d, dm = xh8(w, t + X8_D), xh8(w, t + X8_DMIN)
                a0 = _x8_step(a0, d, dm, xd[m0, b], i0, _x8_mins(w, t, bs32[m0], b * 8))
                a1 = _x8_step(a1, d, dm, xd[m1, b], i1, _x8_mins(w, t, bs32[m1], b * 8))
                a2 = _x8_step(a2, d, dm, xd[m2, b], i2, _x8_mins(w, t, bs32[m2], b * 8))
                a3 = _x8_step(a3, d, dm, xd[m3, b], i3, _x8_mins(w, t, bs32[m3], b * 8))
            vstore(out[m3], grp * 8, a3)  # M % 4 == 3: the last row twice, the same values
            vstore(out[m2], grp * 8, a2)
            vstore(out[m1], grp * 8, a1)
            vstore(out[m0], grp * 8, a0)
        for m in range(full, M):
            acc = vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if m == 0:
                    prefetch_bytes(Rf, pf + t, X8_BYTES, total)
                isum, msum = _x8_block(w, t, xq[m], b * QK_K, bs32[m], b * 8)
                acc = _x8_step(acc, xh8(w, t + X8_D), xh8(w, t + X8_DMIN), xd[m, b], isum, msum)
            vstore(out[m], grp * 8, acc)
    nan_rows(out, ok)
