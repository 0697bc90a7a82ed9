"""Q5_0 and Q5_1 weights repacked eight rows at a time, and their mat-vec kernels over the same 16-bit
activations as ``q16_kernels`` (``hsimd.quantize_rows_q16``).

``q40_x8_kernels``' layout and loop with a fifth bit per weight. One block of eight rows
(``X8_BYTES[type]``, the same bytes as the eight plain blocks, moved):

- the rows' ``d`` (8 float16), for Q5_1 their ``m`` (8 float16);
- the rows' ``qh`` as 16 words, 2 per row (word ``2r + j``, ``j`` 0 or 1), each word holding the fifth
  bits of the 16 weights that word ``j`` of row r's quant words carries in the four chunks (``_bit(c,
  e)`` = ``2c + (e & 1) + 8 (e >> 1)`` for chunk c, field e: the weight ``q40_x8_kernels._src_q4`` maps
  ``(c, e, j)`` to);
- the 128 quant bytes as Q4_0's ``[chunk c][row r][4]``.

So one 32-byte load gives every fifth bit of the block, laid out as the nibbles' words are. Fields e and
e + 2 of a chunk are the low nibbles of the two bytes of ``W >> 4e`` (e 0 or 1), and their fifth
bits sit 8 bits apart in the qh words: ``(W >> 4e) & 0x0F0F | (qh shifted to bits 4 and 12) & 0x1010``
builds both fields' five-bit values in bytes, then ``& 0xFF`` and ``>> 8`` widen them to 16 words each
(``q5pair``): ~13 operations per chunk for the values (Q4_0's: 6), no shuffles, no compares; measured
~10 % faster than one field at a time (``(W >> 4e) & 15 | (qh >> s) & 16``, 17). The -16 of Q5_0 is
folded into the activation block sums (``-16 * sum(a)`` added once per block to all eight rows), as
Q4_0's -8.

The integer sum per row and block is the plain kernel's (``sum(((q | h << 4) - 16) * a)``, exact in 32
bits: at most 32 * 31 * 32767 < 2^25), so results differ from ``q16_kernels.mm16_q5_0`` only in the
order of float additions.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import njit, prange
from .hsimd import H16, hmadd, nan_rows, quantize_rows_q16
from .isimd import itof, izero
from .q40_x8_kernels import iadd_splat, pbcast, permute_rows_q4, row_block
from .rowgroups import prefetch_bytes, x8_group_prefetch, x8_prefetch_from, x8_rows
from .simd import _is_bytes, _ptr, vfma_strict, vmul, vsplat, vstore, vzero
from .x8simd import xh8

__all__ = [
    "KERNELS",
    "LAYOUT",
    "SRC_BYTES",
    "X8_BYTES",
    "mm_q5_0_x8",
    "mm_q5_0_x8r4",
    "mm_q5_1_x8",
    "repack_x8",
    "unpack_x8_rows",
]

#: bytes of one block of eight rows, per type; the plain block's bytes
X8_BYTES = {"Q5_0": 176, "Q5_1": 192}
SRC_BYTES = {"Q5_0": 22, "Q5_1": 24}
#: bytes of halves at the start of a plain block (d, or d and m); then 4 bytes of qh, 16 of qs
LAYOUT = {"Q5_0": 2, "Q5_1": 4}

_I16 = ir.IntType(16)
_V16W = ir.VectorType(_I16, 16)
_I32 = ir.IntType(32)
_V16I = ir.VectorType(_I32, 16)


# -- repacking ----------------------------------------------------------------------------------------
def _weight(c: int, e: int, j: int) -> int:
    """The weight of a row's block that word ``j``, field ``e`` of chunk ``c`` holds."""
    return 16 * (e & 1) + 4 * c + (e >> 1) + 2 * j


def _bit(c: int, e: int) -> int:
    """The bit of a qh word that holds the fifth bit of field ``e`` of chunk ``c``: fields e and e + 2 eight
    bits apart, so that one shift puts both on bits 4 and 12 (``q5pair``)."""
    return 2 * c + (e & 1) + 8 * (e >> 1)


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """``TO_WORD[j, k, v]``: the bits of qh word ``j`` that byte ``k`` (value ``v``) of a plain ``qh``
    sets; ``TO_QH[j, k, v]``: the bits of the plain ``qh`` that byte ``k`` of word ``j`` sets."""
    to_word = np.zeros((2, 4, 256), np.uint16)
    to_qh = np.zeros((2, 2, 256), np.uint32)
    for j in range(2):
        for c in range(4):
            for e in range(4):
                k, p = _weight(c, e, j), _bit(c, e)
                for v in range(256):
                    if v >> (k & 7) & 1:
                        to_word[j, k >> 3, v] |= 1 << p
                    if v >> (p & 7) & 1:
                        to_qh[j, p >> 3, v] |= 1 << k
    return to_word, to_qh


TO_WORD, TO_QH = _tables()


@njit(inline="always")
def _repack_group(A, R, grp, nb, hbytes):
    """``repack_x8``'s group ``grp`` (``hbytes`` a constant where inlined)."""
    sb = hbytes + 20
    xb = 8 * sb
    for b in range(nb):
        out = R[grp, b * xb : (b + 1) * xb]
        for r in range(8):
            w = A[grp * 8 + r, b * sb : (b + 1) * sb]
            for h in range(hbytes):
                out[16 * (h >> 1) + 2 * r + (h & 1)] = w[h]
            for j in range(2):
                word = np.uint16(0)
                for k in range(4):
                    word |= TO_WORD[j, k, w[hbytes + k]]
                out[8 * hbytes + 4 * r + 2 * j] = word & 255
                out[8 * hbytes + 4 * r + 2 * j + 1] = word >> 8
            for k in range(16):
                out[8 * hbytes + 32 + 4 * r + 32 * (k >> 2) + (k & 3)] = w[hbytes + 4 + k]


@njit(parallel=True, cache=True)
def repack_x8(A, R, hbytes):
    """Plain Q5_0 / Q5_1 rows ``A`` (uint8[N, nb * (hbytes + 20)], N a multiple of 8) into ``R``
    (uint8[N // 8, nb * 8 * (hbytes + 20)]); ``hbytes``: ``LAYOUT[type]``. Each block a slice indexed by
    the loop counters alone, ``hbytes`` a constant (``_repack_group`` inlined per layout): one thread, in
    cache (``benchmarks/repack_speed.py``), Q5_0 2048x1536 1.6 -> 0.7-0.8 ms, 1536x8960 7.2-7.4 -> 3.3-3.4
    ms against row offsets; the same bytes."""
    N, rb = A.shape
    nb = rb // (hbytes + 20)
    for grp in prange(N // 8):
        if hbytes == 2:
            _repack_group(A, R, grp, nb, 2)
        elif hbytes == 4:
            _repack_group(A, R, grp, nb, 4)
        else:
            _repack_group(A, R, grp, nb, hbytes)


@njit(parallel=True, cache=True)
def unpack_x8_rows(R, r0, r1, dst, hbytes):
    """Rows ``r0`` .. ``r1`` of a repacked weight back in plain bytes (``dst``: uint8[r1 - r0, nb *
    (hbytes + 20)]), bit for bit the rows ``repack_x8`` was given."""
    sb = hbytes + 20
    xb = 8 * sb
    nb = R.shape[1] // xb
    g0 = r0 // 8
    for gi in prange((r1 + 7) // 8 - g0):
        g8 = g0 + gi
        for b in range(nb):
            s0, t0 = b * sb, b * xb
            for r in range(max(0, r0 - g8 * 8), min(8, r1 - g8 * 8)):
                i = g8 * 8 + r - r0
                for h in range(hbytes):
                    dst[i, s0 + h] = R[g8, t0 + 16 * (h >> 1) + 2 * r + (h & 1)]
                h0 = t0 + 8 * hbytes + 4 * r
                qh = np.uint32(0)
                for j in range(2):
                    for k in range(2):
                        qh |= TO_QH[j, k, R[g8, h0 + 2 * j + k]]
                for k in range(4):
                    dst[i, s0 + hbytes + k] = (qh >> np.uint32(8 * k)) & np.uint32(255)
                q0, d0 = s0 + hbytes + 4, t0 + 8 * hbytes + 32 + 4 * r
                for k in range(16):
                    dst[i, q0 + k] = R[g8, d0 + 32 * (k >> 2) + (k & 3)]


# -- one block of eight rows ------------------------------------------------------------------------------
@intrinsic
def q5pair(typingctx, arr, q, h, odd, k):  # type: ignore[no-untyped-def]
    """Fields ``odd`` and ``odd + 2`` (``odd`` a constant 0 or 1) of the 16 quant words at byte ``q``, each
    with its fifth bit from the 16 qh words at byte ``h`` (bits ``k`` and ``k + 8``, ``k`` 0..7): two
    ``H16`` of values 0..31, built on bytes (one ``and``, shift and ``or`` for both fields), then split."""
    if not (
        _is_bytes(arr)
        and isinstance(q, types.Integer)
        and isinstance(h, types.Integer)
        and isinstance(odd, types.IntegerLiteral)
        and isinstance(k, types.Integer)
    ):
        return None
    o = odd.literal_value
    if o not in (0, 1):
        return None
    ret = types.UniTuple(H16, 2)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        w = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16W), align=1)
        hv = builder.load(_ptr(context, builder, sig.args[0], args[0], args[2], sig.args[2], _V16W), align=1)
        if o:
            w = builder.lshr(w, ir.Constant(_V16W, [4] * 16))
        w = builder.and_(w, ir.Constant(_V16W, [0x0F0F] * 16))
        kv = context.cast(builder, args[4], sig.args[4], types.int16)
        four = ir.Constant(_I16, 4)
        zero = ir.Constant(_I16, 0)
        ge = builder.icmp_signed(">=", kv, four)
        rs = builder.select(ge, builder.sub(kv, four), zero)  # constants once the chunk loop unrolls
        ls = builder.select(ge, zero, builder.sub(four, kv))

        def vec(s):  # type: ignore[no-untyped-def]
            v = builder.insert_element(ir.Constant(_V16W, None), s, ir.Constant(_I32, 0))
            return builder.shuffle_vector(v, ir.Constant(_V16W, None), ir.Constant(_V16I, [0] * 16))

        hv = builder.shl(builder.lshr(hv, vec(rs)), vec(ls))
        x = builder.or_(w, builder.and_(hv, ir.Constant(_V16W, [0x1010] * 16)))
        lo = builder.and_(x, ir.Constant(_V16W, [0xFF] * 16))
        hi = builder.lshr(x, ir.Constant(_V16W, [8] * 16))
        return context.make_tuple(builder, ret, [lo, hi])

    return ret(arr, q, h, odd, k), cg


@njit(inline="always")
def _q5_sum(w, h, q, xpm, x0):
    s = izero()
    for c in range(4):
        qc, xc = q + 32 * c, x0 + 8 * c
        f0, f2 = q5pair(w, qc, h, 0, 2 * c)
        f1, f3 = q5pair(w, qc, h, 1, 2 * c + 1)
        s = hmadd(s, f0, pbcast(xpm, xc))
        s = hmadd(s, f1, pbcast(xpm, xc + 2))
        s = hmadd(s, f2, pbcast(xpm, xc + 4))
        s = hmadd(s, f3, pbcast(xpm, xc + 6))
    return s


# ``blk(acc, w, t, xpm, x0, d, xsum, cor) -> acc``: as ``q40_x8_kernels`` (``cor``: -16 times the sum).
@njit(inline="always")
def _blk_q5_0(acc, w, t, xpm, x0, d, xsum, cor):
    # one FMA, rounded (``vfma``'s fast-math flags let LLVM reassociate the block chain, differently
    # per compile: a fresh compile and Numba's cached copy of it gave different bits); likewise below
    s = iadd_splat(_q5_sum(w, t + 16, t + 48, xpm, x0), cor)
    return vfma_strict(acc, vmul(xh8(w, t), vsplat(d)), itof(s))


@njit(inline="always")
def _blk_q5_1(acc, w, t, xpm, x0, d, xsum, cor):
    acc = vfma_strict(acc, vmul(xh8(w, t), vsplat(d)), itof(_q5_sum(w, t + 32, t + 64, xpm, x0)))
    return vfma_strict(acc, xh8(w, t + 16), vsplat(xsum))


_row_q5_0 = row_block(_blk_q5_0)
_row_q5_1 = row_block(_blk_q5_1)


# -- the loop (``q40_x8_kernels._mm_x8`` / ``prepare_activations`` with the offset -16: copied, not shared, while
# that module changes; the blocks' permutation is shared: ``permute_rows_q4``) ------------------------------
@njit(inline="always")
def _prepare(x, nb, off):
    """(permuted 16-bit activations, scales, scales times sums, ``off`` times the integer sums, finite
    rows)."""
    M = x.shape[0]
    xq = np.empty((M, nb * 32), np.int16)
    xd = np.empty((M, nb), np.float32)
    xs = np.empty((M, nb), np.float32)
    ok = quantize_rows_q16(x, xq, xd, xs)
    xp = np.empty((M, nb * 32), np.int16)
    cor = np.empty((M, nb), np.int32)
    for m in range(M):
        permute_rows_q4(xq, xp, cor, m, nb, off)
    return xp, xd, xs, cor, ok


@njit(inline="always")
def _mm_x8(R, x, out, pfd, nth, blk, xbytes, off):
    nb = R.shape[1] // xbytes
    M = x.shape[0]
    xp, xd, xs, cor, ok = _prepare(x, nb, off)
    x8_rows(R, out, M, pfd, nth, xbytes, blk, x8_group_prefetch, (xp, xd, xs, cor))
    nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mm_q5_0_x8(R, x, out, pfd, nth=2):
    """out[m, :] = W @ (the 16-bit quantized x[m]) for the repacked Q5_0 weight ``R`` (uint8[N // 8,
    nb * 176]); ``pfd``: the prefetch distance in bytes (``rowgroups.x8_prefetch_from``)."""
    _mm_x8(R, x, out, pfd, nth, _row_q5_0, 176, -16)


@njit(parallel=True, cache=True)
def mm_q5_1_x8(R, x, out, pfd, nth=2):
    """As ``mm_q5_0_x8`` for Q5_1 (uint8[N // 8, nb * 192])."""
    _mm_x8(R, x, out, pfd, nth, _row_q5_1, 192, 0)


# -- four activation rows per pass (prompts) ----------------------------------------------------------------
@njit(inline="always")
def _field4(s0, s1, s2, s3, v, x0, x1, x2, x3, i):
    return (
        hmadd(s0, v, pbcast(x0, i)),
        hmadd(s1, v, pbcast(x1, i)),
        hmadd(s2, v, pbcast(x2, i)),
        hmadd(s3, v, pbcast(x3, i)),
    )


@njit(inline="always")
def _q5_sums4(w, h, q, x0, x1, x2, x3, xb):
    """``_q5_sum`` of four activation rows, each five-bit vector decoded once."""
    s0, s1, s2, s3 = izero(), izero(), izero(), izero()
    for c in range(4):
        qc, xc = q + 32 * c, xb + 8 * c
        f0, f2 = q5pair(w, qc, h, 0, 2 * c)
        f1, f3 = q5pair(w, qc, h, 1, 2 * c + 1)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, f0, x0, x1, x2, x3, xc)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, f1, x0, x1, x2, x3, xc + 2)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, f2, x0, x1, x2, x3, xc + 4)
        s0, s1, s2, s3 = _field4(s0, s1, s2, s3, f3, x0, x1, x2, x3, xc + 6)
    return s0, s1, s2, s3


@njit(inline="always")
def _acc_q5_0(a, s, d, xd, cor, m, b):
    """Row ``m``'s float step of block ``b``, as ``_blk_q5_0``'s."""
    return vfma_strict(a, vmul(d, vsplat(xd[m, b])), itof(iadd_splat(s, cor[m, b])))


@njit(inline="always")
def _pass4(w, xp, xd, cor, out, grp, m0, M, nb, pfetch, Rf, pf, total):
    """Rows ``m0 .. m0 + 3`` (past ``M``: the last row again) of the group ``grp``."""
    m1, m2, m3 = min(m0 + 1, M - 1), min(m0 + 2, M - 1), min(m0 + 3, M - 1)
    x0, x1, x2, x3 = xp[m0], xp[m1], xp[m2], xp[m3]
    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
    for b in range(nb):
        t = b * 176
        if pfetch:
            prefetch_bytes(Rf, pf + t, 176, total)
        s0, s1, s2, s3 = _q5_sums4(w, t + 16, t + 48, x0, x1, x2, x3, b * 32)
        d = xh8(w, t)
        a0 = _acc_q5_0(a0, s0, d, xd, cor, m0, b)
        a1 = _acc_q5_0(a1, s1, d, xd, cor, m1, b)
        a2 = _acc_q5_0(a2, s2, d, xd, cor, m2, b)
        a3 = _acc_q5_0(a3, s3, d, xd, cor, m3, b)
    vstore(out[m3], grp * 8, a3)  # rows past M repeat the last one: written again, same values
    vstore(out[m2], grp * 8, a2)
    vstore(out[m1], grp * 8, a1)
    vstore(out[m0], grp * 8, a0)


@njit(inline="always")
def _prepare_rows(x, nb, off):
    """``_prepare``'s arrays, bit for bit, one activation row per thread."""
    M = x.shape[0]
    K = nb * 32
    xq = np.empty((M, K), np.int16)
    xd = np.empty((M, nb), np.float32)
    xs = np.empty((M, nb), np.float32)
    xp = np.empty((M, K), np.int16)
    cor = np.empty((M, nb), np.int32)
    ok = np.empty(M, np.bool_)
    for m in prange(M):
        ok[m] = quantize_rows_q16(x[m : m + 1], xq[m : m + 1], xd[m : m + 1], xs[m : m + 1])[0]
        permute_rows_q4(xq, xp, cor, m, nb, off)
    return xp, xd, xs, cor, ok


@njit(parallel=True, cache=True)
def mm_q5_0_x8r4(R, x, out, pfd):
    """As ``mm_q5_0_x8``, four activation rows per pass over the weight: each five-bit vector is decoded
    once for four rows; every row's result is the one-row kernel's, bit for bit."""
    G, gb = R.shape
    nb = gb // 176
    M = x.shape[0]
    Rf = R.reshape(-1)
    total = G * gb
    xp, xd, xs, cor, ok = _prepare_rows(x, nb, -16)
    for grp in prange(G):
        w = R[grp]
        pf = x8_prefetch_from(grp, gb, pfd)
        for m0 in range(0, M, 4):
            _pass4(w, xp, xd, cor, out, grp, m0, M, nb, m0 == 0, Rf, pf, total)
    nan_rows(out, ok)


#: the kernel of each type
KERNELS = {"Q5_0": mm_q5_0_x8, "Q5_1": mm_q5_1_x8}
