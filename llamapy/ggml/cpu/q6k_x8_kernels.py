"""Q6_K weights repacked eight rows at a time, and their mat-vec kernels over Q8_K activations.

The Q6_K counterpart of ``q4k_x8_kernels`` / ``q5k_x8_kernels`` (read the first's docstring): the eight
32-bit lanes of a register are eight rows, 4 activation bytes are broadcast to all eight, ``pmaddubsw``
multiplies them by 4 bytes of each row, and one ``pmaddwd`` per sub-block of 16 applies the eight rows'
signed scales; the eight ``d`` are one ``vcvtph2ps``.

One super-block of 8 rows (``X8_BYTES`` = 1680, the 8 x 210 of Q6_K: only bits move): the rows' ``d``
(8 float16), their scales (128 signed bytes, per pair of sub-blocks ``2p, 2p + 1`` the 16 bytes ``[2p:
rows 0-3][2p + 1: rows 0-3][2p: rows 4-7][2p + 1: rows 4-7]``, so that one ``vpmovsxbw`` and one
``vpunpck[lh]wd`` give a sub-block's scale in both 16-bit lanes of each row), then per sub-block ``j``
96 bytes: three registers ``P, Q, H`` of ``[row r][4]`` bytes. Row r's weights ``16j + 4g .. 16j + 4g + 3``
(6-bit codes 0..63) are, for groups g = 0, 1, 2, the low 6 bits of its 4 bytes in P, Q, H; group 3's
codes are split over their top 2 bits (bits 0-1 in P, 2-3 in Q, 4-5 in H). Decoding is then one ``and``
per register for groups 0-2 and 8 operations for group 3 (``_x6q``): 2.75 per 32 codes, where the plain
layout's nibbles plus 2-bit fields take 4-5.

The -32 offset: the four products of a sub-block's groups add up in 16 bits (``paddw``, wrapping), from
a start of ``-32 *`` the activations those lanes multiply (``pbcast`` of a pair per sub-block, computed
once per call), so each lane ends at ``sum((q - 32) * a)`` over 8 products: at most 8 x 32 x 127 = 32512
in magnitude, exact in 16 bits however the partial sums wrapped (each ``pmaddubsw`` is at most 2 x 63 x
127, no saturation). The scales then multiply exact values: the integer sum per row and super-block is
the plain kernel's (``kquant_kernels.mm_q6_k``: the same sums, with the offset against the activations'
per-16 sums), so the result differs from it only in the order of the float additions.

``mm_q6_k_x8r4`` takes four activation rows per pass over the weight (prompts): each row's integer sums
and float steps are ``mm_q6_k_x8``'s, so its result is too, bit for bit (the float steps without fast-math
flags, ``(d * d8) * sum + acc`` as the plain kernel rounds ``d * d8``, so that LLVM cannot fold them
differently into the two kernels).
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import njit, prange
from ..quants.layouts import Q6_K_BYTES, Q6_K_D, Q6_K_QH, Q6_K_SCALES
from .hsimd import H16, nan_rows
from .isimd import B32, I32x8, _maddwd, itof, izero
from .kquant_kernels import _q8k
from .q40_x8_kernels import pbcast
from .rowgroups import prefetch_bytes, x8_group_prefetch, x8_prefetch_from, x8_rows
from .simd import _is_bytes, _ptr, vfma_strict, vmul_strict, vsplat, vstore, vzero
from .x8simd import xadd16, xbcast4, xh8, xmaddubs

QK_K = 256
#: bytes of one super-block of eight rows
X8_BYTES = 1680
#: offsets in it: the halves, the scales, the codes (96 bytes per sub-block)
X8_D, X8_SC, X8_Q = 0, 16, 144

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V32B = ir.VectorType(_I8, 32)
_V16W = ir.VectorType(_I16, 16)


@intrinsic
def _x6q(typingctx, arr, idx, g):  # type: ignore[no-untyped-def]
    """Group ``g`` (a constant 0..3) of the sub-block whose registers P, Q, H are at byte ``idx``: the
    32 codes 0..63 (8 rows x 4)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(g, types.IntegerLiteral)):
        return None
    k = g.literal_value
    if not 0 <= k < 4:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        def load(off):  # type: ignore[no-untyped-def]
            i = builder.add(args[1], context.get_constant(sig.args[1], off))
            return builder.load(_ptr(context, builder, sig.args[0], args[0], i, sig.args[1], _V32B), align=1)

        def c8(v):  # type: ignore[no-untyped-def]
            return ir.Constant(_V32B, [v] * 32)

        if k < 3:
            return builder.and_(load(32 * k), c8(0x3F))

        def shr2(v):  # type: ignore[no-untyped-def]
            # 16-bit shifts: every byte's bits 0-1 are zero here, so nothing crosses into the byte below
            w = builder.lshr(builder.bitcast(v, _V16W), ir.Constant(_V16W, [2] * 16))
            return builder.bitcast(w, _V32B)

        u = shr2(builder.and_(load(0), c8(0xC0)))
        u = shr2(builder.or_(u, builder.and_(load(32), c8(0xC0))))
        return shr2(builder.or_(u, builder.and_(load(64), c8(0xC0))))

    return B32(arr, idx, g), cg


_PICK = {
    0: [0, 0, 1, 1, 2, 2, 3, 3, 8, 8, 9, 9, 10, 10, 11, 11],
    1: [4, 4, 5, 5, 6, 6, 7, 7, 12, 12, 13, 13, 14, 14, 15, 15],
}


@intrinsic
def _x6scale(typingctx, arr, idx, k):  # type: ignore[no-untyped-def]
    """Sub-block ``2p + k`` (``k`` a constant 0, 1) of the pair whose 16 scale bytes are at ``idx``: each
    row's signed scale in both of its 16-bit lanes."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(k, types.IntegerLiteral)):
        return None
    j = k.literal_value
    if j not in _PICK:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 16))
        v = builder.sext(builder.load(p, align=1), _V16W)
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 16), _PICK[j]))

    return H16(arr, idx, k), cg


@intrinsic
def _xmadd(typingctx, acc, s, sc):  # type: ignore[no-untyped-def]
    """acc + per row (lanes 2r, 2r + 1): ``s[2r] * sc[2r] + s[2r + 1] * sc[2r + 1]`` (``pmaddwd``)."""
    if acc != I32x8 or s != H16 or sc != H16:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.add(args[0], _maddwd(builder, args[1], args[2]))

    return I32x8(acc, s, sc), cg


# -- the 6-bit codes of a plain block ----------------------------------------------------------------------
@njit(inline="always")
def _codes(w, o, q):
    """The 256 codes 0..63 of the plain Q6_K block at ``o`` of the row ``w`` into ``q`` (ggml's order)."""
    for n in range(2):
        for ll in range(32):
            a, b, h = w[o + 64 * n + ll], w[o + 64 * n + 32 + ll], w[o + Q6_K_QH + 32 * n + ll]
            y = 128 * n + ll
            q[y] = (a & 15) | ((h & 3) << 4)
            q[y + 32] = (b & 15) | (((h >> 2) & 3) << 4)
            q[y + 64] = (a >> 4) | (((h >> 4) & 3) << 4)
            q[y + 96] = (b >> 4) | (((h >> 6) & 3) << 4)


@njit(inline="always")
def _plain(q, w, o):
    """The inverse of ``_codes``: the 256 codes ``q`` as the ``ql``, ``qh`` bytes of the block at ``o``."""
    for n in range(2):
        for ll in range(32):
            y = 128 * n + ll
            q0, q1, q2, q3 = q[y], q[y + 32], q[y + 64], q[y + 96]
            w[o + 64 * n + ll] = (q0 & 15) | ((q2 & 15) << 4)
            w[o + 64 * n + 32 + ll] = (q1 & 15) | ((q3 & 15) << 4)
            w[o + Q6_K_QH + 32 * n + ll] = (q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6)


@njit(inline="always")
def _sc_at(j, r):
    """The byte offset (from ``X8_SC``) of sub-block ``j``'s scale of row ``r``."""
    return 16 * (j >> 1) + 8 * (r >> 2) + 4 * (j & 1) + (r & 3)


@njit(parallel=True, cache=True)
def repack_x8(A, R):
    """Q6_K rows ``A`` (uint8[N, nb * 210], N a multiple of 8) into ``R`` (uint8[N // 8, nb * 1680]).
    One group of eight rows per ``prange`` item (disjoint writes). Each plain block is a slice indexed by
    the loop counters alone (so LLVM sees every offset non-negative and contiguous, and vectorizes the
    decoding of the codes), and group 3's top bits are merged four codes at a time (a 32-bit word per
    row and group): one thread, in cache (``benchmarks/repack_speed.py``), 2048x1536 1.7-2.2 -> 0.53-0.56
    ms, 1536x8960 10.9-13.6 -> 4.7-5.3 ms against row offsets and a byte at a time; the same bytes."""
    N, rb = A.shape
    nb = rb // Q6_K_BYTES
    R32 = R.view(np.uint32)
    m2 = np.uint32(0x03030303)
    for grp in prange(N // 8):
        q = np.empty(QK_K, np.uint8)
        q32 = q.view(np.uint32)
        dst = R[grp]
        d32 = R32[grp]
        for b in range(nb):  # a whole 8-row block at a time: the destination stays in L1
            o, t = b * Q6_K_BYTES, b * X8_BYTES
            for r in range(8):
                blk = A[grp * 8 + r, o : o + Q6_K_BYTES]
                dst[t + X8_D + 2 * r] = blk[Q6_K_D]
                dst[t + X8_D + 2 * r + 1] = blk[Q6_K_D + 1]
                for j in range(16):
                    dst[t + X8_SC + _sc_at(j, r)] = blk[Q6_K_SCALES + j]
                _codes(blk, 0, q)
                s = (t + X8_Q) // 4 + r
                for j in range(16):  # group 3's bits 0-1 / 2-3 / 4-5 as bits 6-7 of groups 0 / 1 / 2
                    e = q32[4 * j + 3]
                    d32[s + 24 * j] = q32[4 * j] | ((e & m2) << 6)
                    d32[s + 24 * j + 8] = q32[4 * j + 1] | (((e >> 2) & m2) << 6)
                    d32[s + 24 * j + 16] = q32[4 * j + 2] | (((e >> 4) & m2) << 6)


@njit(parallel=True, cache=True)
def unpack_x8_rows(R, r0, r1, dst):
    """Rows ``r0`` .. ``r1`` of a repacked weight back in plain Q6_K bytes (``dst``: uint8[r1 - r0,
    nb * 210]), bit for bit the rows ``repack_x8`` was given."""
    nb = R.shape[1] // X8_BYTES
    g0 = r0 // 8
    for gi in prange((r1 + 7) // 8 - g0):
        g8 = g0 + gi
        src = R[g8]
        q = np.empty(QK_K, np.uint8)
        for b in range(nb):  # a whole 8-row block at a time: the source stays in L1
            o, t = b * Q6_K_BYTES, b * X8_BYTES
            for r in range(max(0, r0 - g8 * 8), min(8, r1 - g8 * 8)):
                w = dst[g8 * 8 + r - r0]
                w[o + Q6_K_D] = src[t + X8_D + 2 * r]
                w[o + Q6_K_D + 1] = src[t + X8_D + 2 * r + 1]
                for j in range(16):
                    w[o + Q6_K_SCALES + j] = src[t + X8_SC + _sc_at(j, r)]
                for j in range(16):
                    s = t + X8_Q + 96 * j + 4 * r
                    for i in range(4):
                        p0, p1, p2 = src[s + i], src[s + 32 + i], src[s + 64 + i]
                        q[16 * j + i] = p0 & 63
                        q[16 * j + 4 + i] = p1 & 63
                        q[16 * j + 8 + i] = p2 & 63
                        q[16 * j + 12 + i] = (p0 >> 6) | ((p1 >> 6) << 2) | ((p2 >> 6) << 4)
                _plain(q, w, o)


# -- the activations ---------------------------------------------------------------------------------------
@njit(inline="always")
def _prepare(x):
    """Q8_K of the rows of ``x`` (bytes, scales, finite rows) and per sub-block of 16 the two int16 that
    start its 16-bit sums: ``-32 *`` the activations of products 0, 1 (and 2, 3) of its four groups."""
    xq, xd, bs16, bs32, ok = _q8k(x)
    M, K = xq.shape
    neg = np.empty((M, K // 8), np.int16)
    for m in range(M):
        for j in range(K // 16):
            a = np.int32(0)
            c = np.int32(0)
            for g in range(4):
                i = 16 * j + 4 * g
                a += np.int32(xq[m, i]) + np.int32(xq[m, i + 1])
                c += np.int32(xq[m, i + 2]) + np.int32(xq[m, i + 3])
            neg[m, 2 * j] = -32 * a
            neg[m, 2 * j + 1] = -32 * c
    return xq, xd, neg, ok


# -- the kernels ---------------------------------------------------------------------------------------
@njit(inline="always")
def _sub(isum, w, s, xq, x0, negm, j2, sc):
    """``isum`` plus sub-block ``sc``'s scale times its 8 rows' sums of ``(q - 32) * a`` (codes at ``s``,
    activations at ``x0``, start pair at ``j2`` of ``negm``)."""
    s16 = pbcast(negm, j2)
    s16 = xadd16(s16, xmaddubs(_x6q(w, s, 0), xbcast4(xq, x0)))
    s16 = xadd16(s16, xmaddubs(_x6q(w, s, 1), xbcast4(xq, x0 + 4)))
    s16 = xadd16(s16, xmaddubs(_x6q(w, s, 2), xbcast4(xq, x0 + 8)))
    s16 = xadd16(s16, xmaddubs(_x6q(w, s, 3), xbcast4(xq, x0 + 12)))
    return _xmadd(isum, s16, sc)


@njit(inline="always")
def _x8_block(w, t, xq, x0, negm):
    """The integer sums of one super-block (at ``t``) of eight rows against one activation row."""
    isum = izero()
    for p in range(8):
        s, c = t + X8_Q + 192 * p, t + X8_SC + 16 * p
        isum = _sub(isum, w, s, xq, x0 + 32 * p, negm, x0 // 8 + 4 * p, _x6scale(w, c, 0))
        isum = _sub(isum, w, s + 96, xq, x0 + 32 * p + 16, negm, x0 // 8 + 4 * p + 2, _x6scale(w, c, 1))
    return isum


@njit(parallel=True, cache=True)
def mm_q6_k_x8(R, x, out, pfd, nth=2):
    """out[m, :] = W @ dequantize(quantize(x[m], Q8_K)) for the repacked Q6_K weight ``R``
    (uint8[N // 8, nb * 1680]); ``pfd``: the prefetch distance (``rowgroups.x8_prefetch_from``)."""
    xq, xd, neg, ok = _prepare(x)
    x8_rows(R, out, x.shape[0], pfd, nth, X8_BYTES, _x8_row_block, x8_group_prefetch, (xq, xd, neg))
    nan_rows(out, ok)


@njit(inline="always")
def _x8_row_block(acc, w, t, m, b, a):
    """``rowgroups.x8_rows``' block: activation row ``m``'s step of super-block ``b``."""
    xq, xd, neg = a
    isum = _x8_block(w, t, xq[m], b * QK_K, neg[m])
    return vfma_strict(acc, vmul_strict(xh8(w, t + X8_D), vsplat(xd[m, b])), itof(isum))


@njit(inline="always")
def _group4(s0, s1, s2, s3, q, x0, x1, x2, x3, xo):
    return (
        xadd16(s0, xmaddubs(q, xbcast4(x0, xo))),
        xadd16(s1, xmaddubs(q, xbcast4(x1, xo))),
        xadd16(s2, xmaddubs(q, xbcast4(x2, xo))),
        xadd16(s3, xmaddubs(q, xbcast4(x3, xo))),
    )


@njit(inline="always")
def _sub4(i0, i1, i2, i3, w, s, x0, x1, x2, x3, xo, n0, n1, n2, n3, j2, sc):
    """``_sub`` for four activation rows, each code register decoded once."""
    s0, s1, s2, s3 = pbcast(n0, j2), pbcast(n1, j2), pbcast(n2, j2), pbcast(n3, j2)
    s0, s1, s2, s3 = _group4(s0, s1, s2, s3, _x6q(w, s, 0), x0, x1, x2, x3, xo)
    s0, s1, s2, s3 = _group4(s0, s1, s2, s3, _x6q(w, s, 1), x0, x1, x2, x3, xo + 4)
    s0, s1, s2, s3 = _group4(s0, s1, s2, s3, _x6q(w, s, 2), x0, x1, x2, x3, xo + 8)
    s0, s1, s2, s3 = _group4(s0, s1, s2, s3, _x6q(w, s, 3), x0, x1, x2, x3, xo + 12)
    return _xmadd(i0, s0, sc), _xmadd(i1, s1, sc), _xmadd(i2, s2, sc), _xmadd(i3, s3, sc)


@njit(parallel=True, cache=True)
def mm_q6_k_x8r4(R, x, out, pfd):
    """As ``mm_q6_k_x8``, four activation rows per pass over the weight: each row's result is the
    one-row kernel's, bit for bit."""
    G, gb = R.shape
    nb = gb // X8_BYTES
    M = x.shape[0]
    Rf = R.reshape(-1)
    total = G * gb
    xq, xd, neg, ok = _prepare(x)
    for grp in prange(G):
        w = R[grp]
        pf = x8_prefetch_from(grp, gb, pfd)
        for m0 in range(0, M, 4):
            m1, m2, m3 = min(m0 + 1, M - 1), min(m0 + 2, M - 1), min(m0 + 3, M - 1)
            x0, x1, x2, x3 = xq[m0], xq[m1], xq[m2], xq[m3]
            n0, n1, n2, n3 = neg[m0], neg[m1], neg[m2], neg[m3]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                t = b * X8_BYTES
                if m0 == 0:
                    prefetch_bytes(Rf, pf + t, X8_BYTES, total)
                i0, i1, i2, i3 = izero(), izero(), izero(), izero()
                for p in range(8):
                    s, c, xo, j2 = t + X8_Q + 192 * p, t + X8_SC + 16 * p, b * QK_K + 32 * p, b * 32 + 4 * p
                    sc = _x6scale(w, c, 0)
                    i0, i1, i2, i3 = _sub4(i0, i1, i2, i3, w, s, x0, x1, x2, x3, xo, n0, n1, n2, n3, j2, sc)
                    sc = _x6scale(w, c, 1)
                    i0, i1, i2, i3 = _sub4(
                        i0, i1, i2, i3, w, s + 96, x0, x1, x2, x3, xo + 16, n0, n1, n2, n3, j2 + 2, sc
                    )
                d = xh8(w, t + X8_D)
                a0 = vfma_strict(a0, vmul_strict(d, vsplat(xd[m0, b])), itof(i0))
                a1 = vfma_strict(a1, vmul_strict(d, vsplat(xd[m1, b])), itof(i1))
                a2 = vfma_strict(a2, vmul_strict(d, vsplat(xd[m2, b])), itof(i2))
                a3 = vfma_strict(a3, vmul_strict(d, vsplat(xd[m3, b])), itof(i3))
            vstore(out[m3], grp * 8, a3)  # rows past M repeat the last one: written again, same values
            vstore(out[m2], grp * 8, a2)
            vstore(out[m1], grp * 8, a1)
            vstore(out[m0], grp * 8, a0)
    nan_rows(out, ok)
