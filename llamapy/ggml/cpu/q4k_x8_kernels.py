"""Q4_K weights repacked eight rows at a time, and their mat-vec kernel over Q8_K activations.

The plain Q4_K kernel (``kquant_kernels.mm_q4_k``) keeps each row's partial sums in eight lanes and, per
row and 256 weights, unpacks the 12 scale bytes, applies each sub-block scale to a register of 32
products and sums horizontally at the end. As llama.cpp's ``block_q4_Kx8`` does on AVX2, this layout
puts eight rows side by side so that the eight lanes are the eight rows: per 32 bytes, 4 bytes of each
row (``x8simd``). The activation bytes are broadcast, the products of a sub-block add up in 16 bits,
and one ``pmaddwd`` applies the eight rows' scales of that sub-block; the mins are four ``pmaddwd`` per
super-block; the float scales are one ``vcvtph2ps`` of the rows' eight halves.

One super-block of 8 rows (``X8_BYTES`` = 1184 bytes, the 8 x 144 of Q4_K plus 32): the rows' ``d``
(8 float16), their ``dmin`` (8 float16), the scales as bytes ``[sub-block j][row r]`` (64), the mins as
bytes ``[pair p][row r][2]`` (mins of sub-blocks 2p, 2p + 1; 64), then the 1024 quant bytes
``[chunk c][group g][row r][4]``: bytes ``32c + 4g .. 32c + 4g + 3`` of row r's 128 (low nibbles:
weights ``64c + 4g ..``, high nibbles: ``64c + 32 + 4g ..``). The scales and mins are decoded from their
6-bit form once here, not per row and call (``unpack_x8_rows`` encodes them back bit for bit).

The integer sums per row and super-block are the plain kernel's, so the result differs from it only in
the order of the float additions.

``mm_q4_k_x8r4`` takes four activation rows per pass over the weight (prompts): each 32 weight bytes are
unpacked to nibbles once for the four rows' ``pmaddubsw`` (one chunk's low or high nibbles at a time:
the four 16-bit sums, the four rows' integer sums and the four float accumulators nearly fill the 16
AVX2 registers; as compiled for haswell, a chunk of 4 rows x 64 products is ~250 instructions, 64 of
them ``vpmaddubsw`` and ~26 touching the stack: the nibble mask, some integer sums and raw weight
bytes). Each row's integer sums and float steps are ``mm_q4_k_x8``'s, so its result is too, bit for
bit: the float step of a super-block (``_x8_step``) is written without fast-math flags in the form LLVM
gave the former fast-math steps of the one-row kernel (``d * isum`` rounded, then an FMA with the
activation scale; checked bit for bit against that kernel for haswell and the host's AVX-512), so that
it cannot be folded differently into the two kernels.
"""

from __future__ import annotations

import numpy as np

from ..._numba import njit, prange
from ..quants.layouts import Q4_K_BYTES, Q4_K_QS, Q4_K_SCALES
from .hsimd import nan_rows
from .isimd import bnib, itof, izero
from .kquant_kernels import _q8k
from .rowgroups import prefetch_bytes, x8_group_prefetch, x8_prefetch_from, x8_rows
from .simd import vfma_strict, vmul_strict, vsplat, vstore, vzero
from .x8simd import xadd16, xbcast4, xh8, xmaddubs, xmins, xscale, xzero16

QK_K = 256
#: bytes of one super-block of eight rows
X8_BYTES = 1184
X8_D, X8_DMIN, X8_SC, X8_MN, X8_QS = 0, 16, 32, 96, 160


@njit(inline="always")
def _scale_min(w, o, j):
    """Sub-block ``j``'s 6-bit scale and min of the Q4_K block at ``o`` (ggml's get_scale_min_k4)."""
    q = o + Q4_K_SCALES
    if j < 4:
        return w[q + j] & 63, w[q + j + 4] & 63
    return (w[q + j + 4] & 15) | ((w[q + j - 4] >> 6) << 4), (w[q + j + 4] >> 4) | ((w[q + j] >> 6) << 4)


@njit(parallel=True, cache=True)
def repack_x8(A, R):
    """Q4_K rows ``A`` (uint8[N, nb * 144], N a multiple of 8) into ``R`` (uint8[N // 8, nb * 1184]).
    One group of eight rows per ``prange`` item (disjoint writes). Each plain block
    is a slice indexed by the loop counters alone (LLVM then sees every offset non-negative and constant
    within the block): one thread, in cache (``benchmarks/repack_speed.py``), 2048x1536 0.26-0.40 -> 0.19 ms,
    1536x8960 1.2-1.6 -> 0.8 ms against row offsets; the same bytes."""
    N, rb = A.shape
    nb = rb // Q4_K_BYTES
    A32 = A.view(np.uint32)
    R32 = R.view(np.uint32)
    for grp in prange(N // 8):
        for b in range(nb):  # a whole 8-row block at a time: the destination stays in L1
            o, t = b * Q4_K_BYTES, b * X8_BYTES
            out = R[grp, t : t + X8_BYTES]
            o32 = R32[grp, t // 4 : (t + X8_BYTES) // 4]
            for r in range(8):
                w = A[grp * 8 + r, o : o + Q4_K_BYTES]
                b32 = A32[grp * 8 + r, o // 4 : (o + Q4_K_BYTES) // 4]
                for i in range(2):
                    out[X8_D + 2 * r + i] = w[i]
                    out[X8_DMIN + 2 * r + i] = w[2 + i]
                for j in range(8):
                    sc, mn = _scale_min(w, 0, j)
                    out[X8_SC + 8 * j + r] = sc
                    out[X8_MN + 16 * (j // 2) + 2 * r + (j & 1)] = mn
                for k in range(32):
                    o32[X8_QS // 4 + r + 8 * k] = b32[Q4_K_QS // 4 + k]


@njit(parallel=True, cache=True)
def unpack_x8_rows(R, r0, r1, dst):
    """Rows ``r0`` .. ``r1`` of a repacked weight back in plain Q4_K bytes (``dst``: uint8[r1 - r0,
    nb * 144]), bit for bit the rows ``repack_x8`` was given (quants moved 4 bytes at a time)."""
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
                o, t = b * Q4_K_BYTES, b * X8_BYTES
                D16[i, o // 2] = R16[g8, (t + X8_D) // 2 + r]
                D16[i, o // 2 + 1] = R16[g8, (t + X8_DMIN) // 2 + r]
                q = o + Q4_K_SCALES
                for k in range(4):
                    sc_lo, sc_hi = src[t + X8_SC + 8 * k + r], src[t + X8_SC + 8 * (k + 4) + r]
                    mn_lo = src[t + X8_MN + 16 * (k // 2) + 2 * r + (k & 1)]
                    mn_hi = src[t + X8_MN + 16 * ((k + 4) // 2) + 2 * r + (k & 1)]
                    w[q + k] = sc_lo | ((sc_hi >> 4) << 6)
                    w[q + k + 4] = mn_lo | ((mn_hi >> 4) << 6)
                    w[q + k + 8] = (sc_hi & 15) | ((mn_hi & 15) << 4)
                s32, d32 = (t + X8_QS) // 4 + r, (o + Q4_K_QS) // 4
                for k in range(32):
                    D32[i, d32 + k] = R32[g8, s32 + 8 * k]


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
    isum = izero()
    for c in range(4):
        slo = xzero16()
        shi = xzero16()
        for g in range(8):
            q = t + X8_QS + 256 * c + 32 * g
            slo = xadd16(slo, xmaddubs(bnib(w, q, False), xbcast4(xq, x0 + 64 * c + 4 * g)))
            shi = xadd16(shi, xmaddubs(bnib(w, q, True), xbcast4(xq, x0 + 64 * c + 32 + 4 * g)))
        isum = xscale(isum, slo, w, t + X8_SC + 16 * c)
        isum = xscale(isum, shi, w, t + X8_SC + 16 * c + 8)
    return isum, _x8_mins(w, t, b32, bb)


@njit(inline="always")
def _x8_step(acc, d, dm, xd, isum, msum):
    """``acc + xd * (d * isum) - xd * (dmin * msum)``: the rows' float step of one super-block, rounded
    as LLVM compiled the fast-math ``vfma(acc, vmul(d, xd), isum)``, ``vfma(acc, vmul(dmin, -xd), msum)``
    this kernel had (``d * isum``, ``dmin * msum`` rounded, then two FMAs), written without fast-math
    flags so that it cannot be folded differently into the one-row and four-row kernels."""
    acc = vfma_strict(acc, vsplat(xd), vmul_strict(d, itof(isum)))
    return vfma_strict(acc, vsplat(-xd), vmul_strict(dm, itof(msum)))


@njit(parallel=True, cache=True)
def mm_q4_k_x8(R, x, out, pfd, nth=2):
    """out[m, :] = W @ dequantize(quantize(x[m], Q8_K)) for the repacked Q4_K weight ``R``
    (uint8[N // 8, nb * 1184]); ``pfd``: the prefetch distance in bytes (``rowgroups.x8_prefetch_from``,
    ``prefetch_tune``)."""
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
def _half4(i0, i1, i2, i3, w, q, hi, x0, x1, x2, x3, o, k):
    """The low (``hi`` False) or high nibbles of one chunk (at ``q``) against four activation rows (at
    ``o``): each 32 weight bytes unpacked once for all four, each row's sum scaled into its ``i``."""
    s0, s1, s2, s3 = xzero16(), xzero16(), xzero16(), xzero16()
    for g in range(8):
        v = bnib(w, q + 32 * g, hi)
        s0 = xadd16(s0, xmaddubs(v, xbcast4(x0, o + 4 * g)))
        s1 = xadd16(s1, xmaddubs(v, xbcast4(x1, o + 4 * g)))
        s2 = xadd16(s2, xmaddubs(v, xbcast4(x2, o + 4 * g)))
        s3 = xadd16(s3, xmaddubs(v, xbcast4(x3, o + 4 * g)))
    return xscale(i0, s0, w, k), xscale(i1, s1, w, k), xscale(i2, s2, w, k), xscale(i3, s3, w, k)


@njit(inline="always")
def _x8_sums4(w, t, x0, x1, x2, x3, xo):
    """The scaled quant sums of ``_x8_block`` for four activation rows at once (the same integer sums
    per row)."""
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    for c in range(4):
        q, o, k = t + X8_QS + 256 * c, xo + 64 * c, t + X8_SC + 16 * c
        i0, i1, i2, i3 = _half4(i0, i1, i2, i3, w, q, False, x0, x1, x2, x3, o, k)
        i0, i1, i2, i3 = _half4(i0, i1, i2, i3, w, q, True, x0, x1, x2, x3, o + 32, k + 8)
    return i0, i1, i2, i3


@njit(parallel=True, cache=True)
def mm_q4_k_x8r4(R, x, out, pfd):
    """As ``mm_q4_k_x8``, four activation rows per pass over the weight (prompts): each row's result is
    the one-row kernel's, bit for bit. The last ``M % 4`` rows: three run as a pass of four (the last row
    repeated), one or two one at a time (cheaper than a pass: 1.5 times a one-row pass, measured)."""
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
