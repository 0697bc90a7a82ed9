"""Q4_0 and Q4_1 weights repacked eight rows at a time, and their mat-vec kernels over the same 16-bit
activations as ``q16_kernels`` (``hsimd.quantize_rows_q16``: 1/32767 of each 32-element block's largest
value, not llama.cpp's 8 bits).

The plain kernels (``q16_kernels``) keep one row's partial sums in eight lanes: per row and block of 32
weights, one float scale computed and broadcast, and a horizontal sum per row at the end. Here eight
rows sit side by side so that the eight 32-bit lanes are the eight rows, as llama.cpp's ``block_q4_0x8``
and this package's ``q4k_x8``: per 32 bytes, 4 bytes of each row, read as 16 words (2 per row). One
``and`` / shift picks a nibble of every word (4 fields: 4 vectors of 16 weights, 2 per row); the pair of
16-bit activations those 2 weights multiply is broadcast to all eight rows (``vpbroadcastd`` from a
copy of the activations permuted per block to that order), and one ``pmaddwd`` leaves each row's two
products summed in its own 32-bit lane. The -8 of Q4_0 is not subtracted per weight: ``-8 * sum(a)`` of
the activation block is added once per block to all eight rows. The eight rows' scales are one
``vcvtph2ps``: floats appear once per block of 8 x 32 weights. About 9 vector operations per 32 weights
(the plain kernel: ~11 plus its per-row scale and horizontal sums).

One block of eight rows (``X8_BYTES[type]``): the rows' ``d`` (8 float16), for Q4_1 their ``m`` (8
float16), then the 128 quant bytes as ``[chunk c][row r][4]``: bytes ``4c .. 4c + 3`` of row r's 16 (low
nibbles: weights ``4c ..``, high nibbles: ``16 + 4c ..``). The same bytes as the plain rows, moved: no
size change, and ``unpack_x8_rows`` moves them back bit for bit.

Q8_0 has its own 8-row layout (``q80_x8``: faster prompts, a few % slower decode where every weight is
Q8_0); this form of it measured 0-19 % faster per matrix, within this machine's noise
(benchmarks/results/q40_repack.md).

The integer sum per row and block is the plain kernel's (``sum((q - 8) * a)`` = ``sum(q * a) - 8 *
sum(a)``, exact in 32 bits: at most 32 * 15 * 32767 < 2^24, so also exact as a float), so the results
differ from ``q16_kernels`` only in the order of the float additions (here one conversion per block,
there eight partial lanes per block).
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
from .isimd import I32x8, iadd, isra, itof, izero
from .rowgroups import x8_group_prefetch, x8_rows
from .simd import _is_bytes, _ptr, vfma_strict, vmul, vsplat
from .x8simd import xh8

#: bytes of one block of eight rows, per type; the plain block's bytes; its quant bytes' offset
X8_BYTES = {"Q4_0": 144, "Q4_1": 160}
SRC_BYTES = {"Q4_0": 18, "Q4_1": 20}
#: (bytes of halves at the start of a plain block: d, or d and m; quant bytes per block)
LAYOUT = {"Q4_0": (2, 16), "Q4_1": (4, 16)}

_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V16W = ir.VectorType(_I16, 16)
_V8D = ir.VectorType(_I32, 8)


@intrinsic
def pbcast(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The two int16 at element ``idx`` of an int16 array, repeated 8 times (``vpbroadcastd``)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int16 and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I32), align=2)
        vec = builder.insert_element(ir.Constant(_V8D, None), v, ir.Constant(_I32, 0))
        vec = builder.shuffle_vector(vec, ir.Constant(_V8D, None), ir.Constant(_V8D, [0] * 8))
        return builder.bitcast(vec, _V16W)

    return H16(arr, idx), cg


@intrinsic
def iadd_splat(typingctx, acc, v):  # type: ignore[no-untyped-def]
    """acc + v in every lane (``v`` an integer that fits 32 bits)."""
    if acc != I32x8 or not isinstance(v, types.Integer):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        s = context.cast(builder, args[1], sig.args[1], types.int32)
        vec = builder.insert_element(ir.Constant(_V8D, None), s, ir.Constant(_I32, 0))
        vec = builder.shuffle_vector(vec, ir.Constant(_V8D, None), ir.Constant(_V8D, [0] * 8))
        return builder.add(args[0], vec)

    return I32x8(acc, v), cg


# -- repacking ----------------------------------------------------------------------------------------
@njit(inline="always")
def _repack_group(A16, R16, g, nb, hb2, qc):
    """``repack_x8``'s group ``g`` (16-bit views, ``hb2`` / ``qc``: halves in 16-bit units / quants in
    32-bit units per plain block, constants where inlined)."""
    sb2, xb2 = hb2 + 2 * qc, 8 * (hb2 + 2 * qc)
    for b in range(nb):
        out = R16[g, b * xb2 : (b + 1) * xb2]
        for r in range(8):
            w = A16[g * 8 + r, b * sb2 : (b + 1) * sb2]
            for h in range(hb2):
                out[8 * h + r] = w[h]
            for c in range(qc):
                out[8 * hb2 + 2 * r + 16 * c] = w[hb2 + 2 * c]
                out[8 * hb2 + 2 * r + 16 * c + 1] = w[hb2 + 2 * c + 1]


@njit(parallel=True, cache=True)
def repack_x8(A, R, sbytes, hbytes, qbytes):
    """Plain rows ``A`` (uint8[N, nb * sbytes], N a multiple of 8, C-contiguous) into ``R`` (uint8[N // 8,
    nb * x8], C-contiguous): ``hbytes`` bytes of halves then ``qbytes`` quant bytes per plain block
    (``LAYOUT``), moved 16 bits at a time. Each block a slice indexed by the loop counters alone, with
    the layout's sizes as constants (``_repack_group`` inlined once per layout): 2-D indexing with its
    wraparound and division steps ran at ~0.6 GB/s (110 ms for SmolLM2-135M's 66 MB of Q4_1, a copy 9
    ms), flat 16-bit offsets at ~2; now, one thread, in cache (``benchmarks/repack_speed.py``), Q4_0
    2048x1536 0.93 -> 0.20 ms, 1536x8960 4.1-4.3 -> 1.1 ms (Q4_1: 1.0 -> 0.23, 4.3 -> 1.5-1.6)."""
    N = A.shape[0]
    nb = A.shape[1] // sbytes
    A16 = A.view(np.uint16)
    R16 = R.view(np.uint16)
    for g in prange(N >> 3):
        if hbytes == 2 and qbytes == 16:
            _repack_group(A16, R16, g, nb, 1, 4)
        elif hbytes == 4 and qbytes == 16:
            _repack_group(A16, R16, g, nb, 2, 4)
        else:
            _repack_group(A16, R16, g, nb, hbytes >> 1, qbytes >> 2)


@njit(parallel=True, cache=True)
def unpack_x8_rows(R, r0, r1, dst, sbytes, hbytes, qbytes):
    """Rows ``r0`` .. ``r1`` of a repacked weight back in plain bytes (``dst``: uint8[r1 - r0, nb *
    sbytes]), bit for bit the rows ``repack_x8`` was given."""
    xb = 8 * (hbytes + qbytes)
    nb = R.shape[1] // xb
    R16 = R.view(np.uint16)
    D16 = dst.view(np.uint16)
    g0 = r0 // 8
    for gi in prange((r1 + 7) // 8 - g0):
        g8 = g0 + gi
        for b in range(nb):
            s0, t0 = b * sbytes, b * xb
            for r in range(max(0, r0 - g8 * 8), min(8, r1 - g8 * 8)):
                i = g8 * 8 + r - r0
                for h in range(hbytes // 2):
                    D16[i, s0 // 2 + h] = R16[g8, (t0 + 16 * h + 2 * r) // 2]
                q0, d0 = (s0 + hbytes) // 2, (t0 + 8 * hbytes + 4 * r) // 2
                for k in range(qbytes // 2):
                    D16[i, q0 + k] = R16[g8, d0 + 16 * (k // 2) + (k & 1)]


def _word_field(in_place: bool, doc: str):  # type: ignore[no-untyped-def]
    """An intrinsic ``(arr, idx, e)``: field ``e`` (a constant 0..3) of the 16 words at byte ``idx``,
    shifted down to 0..15 (``in_place`` False) or left in place (True: one ``and`` for e < 3)."""

    @intrinsic
    def fn(typingctx, arr, idx, e):  # type: ignore[no-untyped-def]
        if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(e, types.IntegerLiteral)):
            return None
        k = e.literal_value
        if not 0 <= k < 4:
            return None

        def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
            ptr = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16W)
            v = builder.load(ptr, align=1)
            if k == 3:
                return builder.lshr(v, ir.Constant(_V16W, [12] * 16))
            if in_place:
                return builder.and_(v, ir.Constant(_V16W, [15 << (4 * k)] * 16))
            if k:
                v = builder.lshr(v, ir.Constant(_V16W, [4 * k] * 16))
            return builder.and_(v, ir.Constant(_V16W, [15] * 16))

        return H16(arr, idx, e), cg

    fn.__doc__ = doc
    return fn


wnib = _word_field(
    False,
    "Field ``e`` (a constant 0..3) of the 16 words at byte ``idx``: bits ``4e .. 4e + 3`` of each, 0..15.",
)
wfield = _word_field(
    True,
    """Field ``e`` (a constant 0..3) of the 16 words at byte ``idx`` left in place: ``word & (15 << 4e)``,
    0..15 times ``16**e`` (at most 3840, so it stays a positive int16) for e < 3; the top field shifted
    down (e = 3). One operation per field where ``wnib`` takes two for the middle ones.""",
)


# -- one block of eight rows per type -------------------------------------------------------------------
# The quants of a block, per 4-byte chunk c of 8 rows (32 bytes), read as 16 words (2 per row): ``e``
# picks a field of each word, and the pair of activations those two fields multiply sits at ``8c + 2e``
# of the block's permuted activations (``_src_q4``: the element of the block that permuted element ``p`` is).
@njit(inline="always")
def _src_q4(p):
    c, e, j = p >> 3, (p >> 1) & 3, p & 1
    return 16 * (e & 1) + 4 * c + (e >> 1) + 2 * j


_V32W = ir.VectorType(_I16, 32)
#: ``_src_q4`` of each permuted element, as a shuffle mask
_SRC_Q4 = [_src_q4.py_func(p) for p in range(32)]


@intrinsic
def permute_q4(typingctx, src, dst, idx):  # type: ignore[no-untyped-def]
    """``dst[idx + p] = src[idx + _src_q4(p)]`` for the 32 int16 of one block: one shuffle of a
    ``<32 x i16>`` (a few ``vpshufb`` / ``vpermq`` / blends on AVX2), where the loop of 32 was scalar."""
    ok = isinstance(src, types.Array) and src.dtype == types.int16 and src == dst
    if not (ok and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        a = builder.load(_ptr(context, builder, sig.args[0], args[0], args[2], sig.args[2], _V32W), align=2)
        v = builder.shuffle_vector(a, ir.Constant(_V32W, None), ir.Constant(ir.VectorType(_I32, 32), _SRC_Q4))
        builder.store(v, _ptr(context, builder, sig.args[1], args[1], args[2], sig.args[2], _V32W), align=2)
        return context.get_dummy_value()

    return types.none(src, dst, idx), cg


@njit(inline="always")
def permute_rows_q4(xq, xp, cor, m, nb, off):
    """Row ``m`` of the 16-bit activations ``xq`` as the x8 kernels read them: each block permuted into
    ``xp`` (``_src_q4``), and ``off`` times each block's integer sum into ``cor`` (Q4_0: -8, Q5_0: -16)."""
    qr, pr = xq[m], xp[m]
    for b in range(nb):
        x0 = np.uint64(32 * b)  # unsigned: no wraparound test per element, so the sum vectorizes
        permute_q4(qr, pr, x0)
        t = np.int32(0)
        for p in range(np.uint64(32)):
            t += np.int32(qr[x0 + p])
        cor[m, b] = off * t


# ``blk(acc, w, t, xpm, x0, d, xsum, cor) -> acc``: ``w`` the group's bytes, ``t`` the block's offset,
# ``xpm`` the permuted 16-bit activations, ``x0`` the block's first element, ``d`` their scale, ``xsum`` d
# times their sum, ``cor`` -8 times their sum (an integer).
@njit(inline="always")
def _q4_sum(w, q, xpm, x0):
    """The block's integer sums per row: fields 1 and 2 multiplied in place (16 and 256 times the nibble,
    ``wfield``) into sums of their own, divided back exactly at the end (every product a multiple of 16
    or 256; at most 4 x 2 x 3840 x 32767 < 2**31 in a lane); fields 0 and 3 into a third. The same sums as
    unpacking each nibble to 0..15 first, with 4 operations a chunk instead of 6."""
    s0, s1, s2 = izero(), izero(), izero()
    for c in range(4):
        qc, xc = q + 32 * c, x0 + 8 * c
        s0 = hmadd(s0, wfield(w, qc, 0), pbcast(xpm, xc))
        s1 = hmadd(s1, wfield(w, qc, 1), pbcast(xpm, xc + 2))
        s2 = hmadd(s2, wfield(w, qc, 2), pbcast(xpm, xc + 4))
        s0 = hmadd(s0, wfield(w, qc, 3), pbcast(xpm, xc + 6))
    return iadd(s0, iadd(isra(s1, 4), isra(s2, 8)))


@njit(inline="always")
def _blk_q4_0(acc, w, t, xpm, x0, d, xsum, cor):
    s = iadd_splat(_q4_sum(w, t + 16, xpm, x0), cor)
    return vfma_strict(acc, vmul(xh8(w, t), vsplat(d)), itof(s))


@njit(inline="always")
def _blk_q4_1(acc, w, t, xpm, x0, d, xsum, cor):
    # two FMAs in a row: rounded each (no reassociation), so the several-rows kernels can match bit for bit
    acc = vfma_strict(acc, vmul(xh8(w, t), vsplat(d)), itof(_q4_sum(w, t + 32, xpm, x0)))
    return vfma_strict(acc, xh8(w, t + 16), vsplat(xsum))


def row_block(blk):  # type: ignore[no-untyped-def]
    """``blk`` as ``rowgroups.x8_rows``' block ``(acc, w, t, m, b, a)``: activation row ``m``'s step of
    block ``b``, ``a`` being ``prepare_activations``' (permuted activations, scales, scaled sums,
    corrections; the Q5 kernels' ``_prepare`` too)."""

    @njit(inline="always")
    def row(acc, w, t, m, b, a):  # type: ignore[no-untyped-def]
        xp, xd, xs, cor = a
        return blk(acc, w, t, xp[m], b * 32, xd[m, b], xs[m, b], cor[m, b])

    return row


_row_q4_0 = row_block(_blk_q4_0)
_row_q4_1 = row_block(_blk_q4_1)


# -- the loop -----------------------------------------------------------------------------------------------
@njit(inline="always")
def _mm_x8(R, x, out, pfd, nth, blk, xbytes):
    """The one-row kernels' body: ``rowgroups.x8_rows`` with ``blk`` (``_row_q4_0`` / ``_row_q4_1``)."""
    nb = R.shape[1] // xbytes
    M = x.shape[0]
    xp, xd, xs, cor, ok = prepare_activations(x, nb)
    x8_rows(R, out, M, pfd, nth, xbytes, blk, x8_group_prefetch, (xp, xd, xs, cor))
    nan_rows(out, ok)


@njit(inline="always")
def prepare_activations(x, nb):
    """The activations as the kernels read them, here and in ``q40_r8_kernels``: (permuted 16-bit
    values, scales, scales times sums, -8 times the integer sums, finite rows)."""
    M = x.shape[0]
    xq = np.empty((M, nb * 32), np.int16)
    xd = np.empty((M, nb), np.float32)
    xs = np.empty((M, nb), np.float32)
    ok = quantize_rows_q16(x, xq, xd, xs)
    xp = np.empty((M, nb * 32), np.int16)
    cor = np.empty((M, nb), np.int32)
    for m in range(M):
        permute_rows_q4(xq, xp, cor, m, nb, -8)
    return xp, xd, xs, cor, ok


@njit(parallel=True, cache=True)
def mm_q4_0_x8(R, x, out, pfd, nth=2):
    """out[m, :] = W @ (the 16-bit quantized x[m]) for the repacked Q4_0 weight ``R`` (uint8[N // 8,
    nb * 144]); ``pfd``: the prefetch distance in bytes (``rowgroups.x8_prefetch_from``)."""
    _mm_x8(R, x, out, pfd, nth, _row_q4_0, 144)


@njit(parallel=True, cache=True)
def mm_q4_1_x8(R, x, out, pfd, nth=2):
    """As ``mm_q4_0_x8`` for Q4_1 (uint8[N // 8, nb * 160])."""
    _mm_x8(R, x, out, pfd, nth, _row_q4_1, 160)


#: the kernel of each type (several rows per pass: ``q40_x8_rows``)
KERNELS = {"Q4_0": mm_q4_0_x8, "Q4_1": mm_q4_1_x8}
