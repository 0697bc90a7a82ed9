"""Mat-vec kernels for the k-quants (Q4_K, Q5_K, Q6_K): 8-bit activations and integer dot products.

As llama.cpp does (its ``vec_dot_type`` for these types is ``Q8_K``), each call first quantizes the
activation rows to ``Q8_K`` (per 256 elements: a float scale, 256 signed bytes and the 16 sums of
each 16 bytes), bit for bit as ``quants.quantize(x, Q8_K)``. Then per 32 weights of a row: unpack
the 4-6 bit quants into 32 bytes, multiply them with 32 activation bytes and the sub-block scale in
integers (``isimd.imadd``: two instructions on AVX2), and add into eight 32-bit lanes. Floats appear
once per 256-element super-block: ``d * d8 * sum`` and the mins (Q4_K, Q5_K) or the -32 offset
(Q6_K) against the byte sums of the activations.

Result: ``out = W @ dequantize(quantize(x, Q8_K))`` up to float rounding of the super-block sums;
against float activations the normalized squared error is ~3e-5 (llama.cpp's is the same). Measured
on the 2-core AVX2 VM, 896x4864, 2 threads: 2-3x the float kernels this replaced (Q5_K 10 -> 27 GB/s).

Call as ``MATVEC`` in ``matmul_kernels``: ``kern(w, x, out, f16)``; K must be a multiple of 256 (it is
for every k-quant row).
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

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
from .hsimd import H16, hload, nan_rows
from .isimd import (
    B32,
    I32x8,
    _maddubs,
    _maddwd,
    bload,
    bnib,
    bq5,
    bq6,
    ikscales,
    ilane,
    iload,
    imadd,
    imul,
    itof,
    izero,
)
from .layouts import ROWS_PER_PASS
from .rowgroups import PREFETCH_ROWS, f16at, prefetch_bytes, prefetch_bytes_l1, rows4, store4
from .simd import _is_bytes, _ptr, vfma, vsplat, vzero

QK_K = 256


@njit(cache=True)
def quantize_rows_q8_k(x, xq, xd, bs16, bs32):
    """Quantize the rows of ``x`` (float32[M, K]) to Q8_K: bytes ``xq`` int8[M, K], scales ``xd``
    float32[M, K // 256], sums of each 16 bytes ``bs16`` and each 32 bytes ``bs32`` (int32). Not
    ``fastmath``: the rounding is ggml's, so the bytes match ``quantize(x, Q8_K)``. Returns whether
    each row is finite (a super-block with an inf or NaN is quantized as zeros: the kernels, which
    may assume finite floats, then write NaN for that row).

    The absolute maximum and its first position come from one integer max over ``|bits| << 8 |
    (255 - j)`` (the float bits without the sign order as the values do; equal maxima: the first wins,
    as ggml; NaN and inf bits are above every finite one), which vectorizes where a float max with a
    branch per element does not: 3.3 -> 2.4 us per 1536-element row, 11.6 -> 6.0 per 8960 (CPU)."""
    M, K = x.shape
    ok = np.ones(M, np.bool_)
    xb = x.view(np.int32)
    for m in range(M):
        for b in range(K // QK_K):
            x0 = b * QK_K
            key = np.int64(0)
            for j in range(QK_K):
                key = max(key, (np.int64(xb[m, x0 + j] & 0x7FFFFFFF) << 8) | (255 - j))
            abits = key >> 8
            finite = abits < 0x7F800000  # the bits of inf; NaN's are above
            if abits == 0 or not finite:
                ok[m] = ok[m] and finite
                xd[m, b] = np.float32(0.0)
                xq[m, x0 : x0 + QK_K] = 0
            else:
                mx = x[m, x0 + 255 - (key & 255)]
                iscale = np.float32(-127.0) / mx
                for j in range(QK_K):
                    q = np.rint(iscale * x[m, x0 + j])
                    xq[m, x0 + j] = np.int8(q if q < np.float32(127.0) else np.float32(127.0))
                xd[m, b] = np.float32(1.0) / iscale
            for j in range(16):
                s = np.int32(0)
                for i in range(16):
                    s += np.int32(xq[m, x0 + 16 * j + i])
                bs16[m, 16 * b + j] = s
            for j in range(8):
                bs32[m, 8 * b + j] = bs16[m, 16 * b + 2 * j] + bs16[m, 16 * b + 2 * j + 1]
    return ok


@njit(inline="always")
def _q8k(x):
    M, K = x.shape
    xq = np.empty((M, K), np.int8)
    xd = np.empty((M, K // QK_K), np.float32)
    bs16 = np.empty((M, K // 16), np.int32)
    bs32 = np.empty((M, K // 32), np.int32)
    ok = quantize_rows_q8_k(x, xq, xd, bs16, bs32)
    return xq, xd, bs16, bs32, ok


@njit(inline="always")
def _q4k_row(acc, wr, o, xq, x0, d8, bsv, bs16, f16):
    """One Q4_K block (``o``) of one row against the activation bytes from ``x0``: 8 sub-blocks of
    32, each nibble run times its 6-bit scale; the mins times the per-32 byte sums ``bsv``."""
    sc, mn = ikscales(wr, o + Q4_K_SCALES)
    s = izero()
    for c in range(4):
        q = o + Q4_K_QS + 32 * c
        s = imadd(s, bnib(wr, q, False), bload(xq, x0 + 64 * c), ilane(sc, 2 * c))
        s = imadd(s, bnib(wr, q, True), bload(xq, x0 + 64 * c + 32), ilane(sc, 2 * c + 1))
    acc = vfma(acc, vsplat(f16at(wr, o, f16) * d8), itof(s))
    return vfma(acc, vsplat(-f16at(wr, o + Q4_K_DMIN, f16) * d8), itof(imul(mn, bsv)))


@njit(inline="always")
def _q5k_row(acc, wr, o, xq, x0, d8, bsv, bs16, f16):
    """As ``_q4k_row`` for Q5_K: fifth bits 2c and 2c + 1 of the 32 bytes of ``qh``."""
    sc, mn = ikscales(wr, o + Q5_K_SCALES)
    qh = o + Q5_K_QH
    s = izero()
    for c in range(4):
        q = o + Q5_K_QS + 32 * c
        s = imadd(s, bq5(wr, q, False, qh, 2 * c), bload(xq, x0 + 64 * c), ilane(sc, 2 * c))
        s = imadd(s, bq5(wr, q, True, qh, 2 * c + 1), bload(xq, x0 + 64 * c + 32), ilane(sc, 2 * c + 1))
    acc = vfma(acc, vsplat(f16at(wr, o, f16) * d8), itof(s))
    return vfma(acc, vsplat(-f16at(wr, o + Q5_K_DMIN, f16) * d8), itof(imul(mn, bsv)))


# -- Q6_K -----------------------------------------------------------------------------------------------
# As llama.cpp's ``ggml_vec_dot_q6_K_q8_K`` (AVX2): the 16 signed scales widened to 16 bits once a block,
# each 32-weight run times its pair of scales with one ``pmaddwd``, and the -32 offset in integers (the
# scales against the activations' per-16 byte sums, one ``pmaddwd``, times 32, subtracted), so a block
# ends in one conversion and one FMA. Two changes against the general row protocol save the rest: the
# scales are held even-numbered in the low 128 bits and odd-numbered in the high (``_q6scales``), so a
# run's pair is one in-lane ``vpshufb`` (``_imadd_q6``: ggml needs a shuffle and a widening per run), and
# the activation row's per-16 sums are stored once per call as int16 in the same order (``q6_bsums``),
# where the general loop's int32 sums needed a widening of the scales and two 32-bit multiplies per block.
_SPLIT = [2 * i for i in range(8)] + [2 * i + 1 for i in range(8)]
_V16W = ir.VectorType(ir.IntType(16), 16)
_V8D = ir.VectorType(ir.IntType(32), 8)


@intrinsic
def _q6scales(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 16 signed scale bytes at ``idx`` as 16-bit lanes: scales 0, 2, .., 14 in the low 128 bits,
    1, 3, .., 15 in the high."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(
            context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(ir.IntType(8), 16)
        )
        v = builder.load(p, align=1)
        v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), 16), _SPLIT))
        return builder.sext(v, _V16W) if sig.args[0].dtype == types.int8 else builder.zext(v, _V16W)

    return H16(arr, idx), cg


@intrinsic
def _imadd_q6(typingctx, acc, u, s, sc, k):  # type: ignore[no-untyped-def]
    """acc + the 32 products ``u * s`` (``pmaddubsw``) times scale ``2k`` (first 16) and ``2k + 1`` (last
    16) of ``sc`` (``_q6scales``'s order; ``k`` a constant 0..7), summed into 8 lanes (``pmaddwd``)."""
    if acc != I32x8 or u != B32 or s != B32 or sc != H16 or not isinstance(k, types.IntegerLiteral):
        return None
    j = k.literal_value
    if not 0 <= j < 8:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        mask = ir.Constant(ir.VectorType(ir.IntType(32), 16), [j] * 8 + [8 + j] * 8)
        pair = builder.shuffle_vector(args[3], args[3], mask)
        return builder.add(args[0], _maddwd(builder, _maddubs(builder, args[1], args[2]), pair))

    return I32x8(acc, u, s, sc, k), cg


@intrinsic
def _q6offset(typingctx, acc, sc, bs):  # type: ignore[no-untyped-def]
    """acc - 32 * (the 16 products ``sc * bs``, summed in pairs into 8 lanes): Q6_K's -32 offset."""
    if acc != I32x8 or sc != H16 or bs != H16:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        t = _maddwd(builder, args[1], args[2])
        return builder.sub(args[0], builder.shl(t, ir.Constant(_V8D, [5] * 8)))

    return I32x8(acc, sc, bs), cg


@njit(inline="always")
def q6_bsums(bs16):
    """The per-16 activation byte sums (int32[M, K // 16]) as int16 (|sum| <= 2032), each block's 16 in
    ``_q6scales``'s order (even-numbered first): the ``bs16`` argument of ``_q6k_row``."""
    M, n = bs16.shape
    bq = np.empty((M, n), np.int16)
    for m in range(M):
        for b in range(n // 16):
            for i in range(8):
                bq[m, 16 * b + i] = bs16[m, 16 * b + 2 * i]
                bq[m, 16 * b + 8 + i] = bs16[m, 16 * b + 2 * i + 1]
    return bq


@njit(inline="always")
def _q6k_row(acc, wr, o, xq, x0, d8, bsv, bq, f16):
    """One Q6_K block of one row: two halves of 128, each four runs of 32 (low/high nibbles of the two
    32-byte runs of ``ql`` with bits 0-1, 2-3, 4-5, 6-7 of ``qh``), a signed scale per 16. The quants go
    in as 0..63; the -32 offset is subtracted in integers against ``bq`` (``q6_bsums``' int16 sums, not
    the general loop's int32 ``bs16``). The integer sum of a block is exact (|s| < 2^29)."""
    scv = _q6scales(wr.view(np.int8), o + Q6_K_SCALES)
    ql, qh = o, o + Q6_K_QH
    s = izero()
    s = _imadd_q6(s, bq6(wr, ql, False, qh, 0), bload(xq, x0), scv, 0)
    s = _imadd_q6(s, bq6(wr, ql + 32, False, qh, 2), bload(xq, x0 + 32), scv, 1)
    s = _imadd_q6(s, bq6(wr, ql, True, qh, 4), bload(xq, x0 + 64), scv, 2)
    s = _imadd_q6(s, bq6(wr, ql + 32, True, qh, 6), bload(xq, x0 + 96), scv, 3)
    ql, qh = o + 64, o + Q6_K_QH + 32
    s = _imadd_q6(s, bq6(wr, ql, False, qh, 0), bload(xq, x0 + 128), scv, 4)
    s = _imadd_q6(s, bq6(wr, ql + 32, False, qh, 2), bload(xq, x0 + 160), scv, 5)
    s = _imadd_q6(s, bq6(wr, ql, True, qh, 4), bload(xq, x0 + 192), scv, 6)
    s = _imadd_q6(s, bq6(wr, ql + 32, True, qh, 6), bload(xq, x0 + 224), scv, 7)
    s = _q6offset(s, scv, hload(bq, x0 // 16))
    return vfma(acc, vsplat(f16at(wr, o + Q6_K_D, f16) * d8), itof(s))


# -- the loop -----------------------------------------------------------------------------------------
# Every k-quant kernel is this loop specialized (inlined) for one row function, as ``q16_kernels``: a
# row function is ``row(acc, wr, o, xq, x0, d8, bsv, bs16, f16) -> acc`` (``bsv``: the block's 8
# per-32 byte sums as a vector, ``bs16``: the row's per-16 byte sums; each takes what it needs, LLVM
# drops the other). Not ``fastmath``: a function that a fastmath kernel compiles as its callee gets the
# kernel's flags (measured: the quantizer then lost its NaN test). The vector intrinsics carry their
# own fast flags. ``pfb`` is the prefetch (``rowgroups.prefetch_bytes``: into L2, or ``prefetch_bytes_l1``
# for the ``*_l1`` kernels).
@njit(inline="always")
def matvec_k(w, x, out, f16, row, bbytes):
    matvec_k_pf(w, x, out, f16, row, bbytes, prefetch_bytes)


@njit(inline="always")
def matvec_k_pf(w, x, out, f16, row, bbytes, pfb):
    N, rb = w.shape
    nb = rb // bbytes
    wf = w.reshape(-1)
    xq, xd, bs16, bs32, ok = _q8k(x)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xqm, b16m, b32m = xq[m], bs16[m], bs32[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    pfb(wf, pf + b * ROWS_PER_PASS * bbytes, ROWS_PER_PASS * bbytes, N * rb)
                o, x0, d8 = b * bbytes, b * QK_K, xd[m, b]
                bsv = iload(b32m, b * 8)
                a0 = row(a0, w0, o, xqm, x0, d8, bsv, b16m, f16)
                a1 = row(a1, w1, o, xqm, x0, d8, bsv, b16m, f16)
                a2 = row(a2, w2, o, xqm, x0, d8, bsv, b16m, f16)
                a3 = row(a3, w3, o, xqm, x0, d8, bsv, b16m, f16)
            store4(out, m, g, N, a0, a1, a2, a3)
    nan_rows(out, ok)


@njit(inline="always")
def matvec_q6k(w, x, out, f16, pfb):
    """``matvec_k_pf`` for Q6_K: the activation rows' per-16 sums as ``q6_bsums`` in the ``bs16`` slot."""
    N, rb = w.shape
    nb = rb // Q6_K_BYTES
    wf = w.reshape(-1)
    xq, xd, bs16, bs32, ok = _q8k(x)
    bq = q6_bsums(bs16)
    for g in prange((N + 3) // 4):
        w0, w1, w2, w3 = rows4(w, g, N)
        pf = (g * 4 + PREFETCH_ROWS) * rb
        for m in range(x.shape[0]):
            xqm, bqm = xq[m], bq[m]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for b in range(nb):
                if m == 0:
                    pfb(wf, pf + b * ROWS_PER_PASS * Q6_K_BYTES, ROWS_PER_PASS * Q6_K_BYTES, N * rb)
                o, x0, d8 = b * Q6_K_BYTES, b * QK_K, xd[m, b]
                a0 = _q6k_row(a0, w0, o, xqm, x0, d8, 0, bqm, f16)
                a1 = _q6k_row(a1, w1, o, xqm, x0, d8, 0, bqm, f16)
                a2 = _q6k_row(a2, w2, o, xqm, x0, d8, 0, bqm, f16)
                a3 = _q6k_row(a3, w3, o, xqm, x0, d8, 0, bqm, f16)
            store4(out, m, g, N, a0, a1, a2, a3)
    nan_rows(out, ok)


@njit(parallel=True, cache=True)
def mm_q4_k(w, x, out, f16):
    matvec_k(w, x, out, f16, _q4k_row, Q4_K_BYTES)


@njit(parallel=True, cache=True)
def mm_q5_k(w, x, out, f16):
    matvec_k(w, x, out, f16, _q5k_row, Q5_K_BYTES)


@njit(parallel=True, cache=True)
def mm_q6_k(w, x, out, f16):
    matvec_q6k(w, x, out, f16, prefetch_bytes)


# The same kernels with the weight prefetched into L1 (for models mostly in L3: ``matmul_steps``).
@njit(parallel=True, cache=True)
def mm_q4_k_l1(w, x, out, f16):
    matvec_k_pf(w, x, out, f16, _q4k_row, Q4_K_BYTES, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm_q5_k_l1(w, x, out, f16):
    matvec_k_pf(w, x, out, f16, _q5k_row, Q5_K_BYTES, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm_q6_k_l1(w, x, out, f16):
    matvec_q6k(w, x, out, f16, prefetch_bytes_l1)
