"""16-bit integer vectors for Numba kernels: the 32-element block types against 16-bit activations.

llama.cpp's AVX2 kernels for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 quantize the activations to 8 bits per
32-element block (``Q8_0``/``Q8_1``): ~0.4 % of the block's largest value lost on every activation.
Here the activations are quantized to 16 bits per 32-element block instead (``quantize_rows_q16``:
1/32767 of the block maximum, about float16's precision, far below the weights' own error), so the
result stays as close to the float product as the float kernels this replaced, while the products
are integer instructions: the weight bytes are widened to 16 bits (``vpmovzxbw``/``vpmovsxbw``,
one instruction for 16 weights) and ``pmaddwd`` multiplies 16 weights by 16 activations and adds pairs
into 8 lanes of 32 bits. Floats appear once per block (the weight scale times the activation scale).

The type ``H16`` is ``<16 x i16>``. Every operation is generic LLVM vector IR except ``hmadd``,
which calls ``llvm.x86.avx2.pmadd.wd`` where ``isimd.HAVE_AVX2`` holds (elsewhere the same arithmetic
widened to 32 bits: identical results). Ranges: weights -128..127 (Q8_0) or 0..31, activations
-32767..32767, so a pair sum is below 2^23 and a block's lane (two pairs) below 2^24: no overflow.

Index arguments are element offsets into 1-D C-contiguous arrays and are not bounds-checked.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, models, register_model

from ..._numba import njit
from ..quants._rowq import _nearest_int
from .isimd import B32, I32x8, _maddubs, _maddwd
from .simd import _is_bytes, _ptr, absmax_bits32, bitcast_f32

__all__ = ["H16", "hwiden", "hload", "hnib", "hq5", "hmadd", "imadd_pair", "quantize_rows_q16"]

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V16B = ir.VectorType(_I8, 16)
_V16W = ir.VectorType(_I16, 16)


class _H16(types.Type):
    def __init__(self) -> None:
        super().__init__(name="H16")


H16 = _H16()


@register_model(_H16)
class _H16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, _V16W)


def _cw(v: int):  # type: ignore[no-untyped-def]
    return ir.Constant(_V16W, [v] * 16)


def _bytes16(context, builder, sig, args):  # type: ignore[no-untyped-def]
    p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16B)
    return builder.load(p, align=1)


@intrinsic
def hwiden(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 16 bytes at ``idx`` as 16-bit lanes: sign-extended from an int8 array, else zero-extended."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    signed = arr.dtype == types.int8

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = _bytes16(context, builder, sig, args)
        return builder.sext(v, _V16W) if signed else builder.zext(v, _V16W)

    return H16(arr, idx), cg


@intrinsic
def hnib(typingctx, arr, idx, hi, off):  # type: ignore[no-untyped-def]
    """The low (``hi`` False) or high nibbles of the 16 bytes at ``idx``, plus the constant ``off``."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(off, types.IntegerLiteral)):
        return None
    k = off.literal_value

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = builder.zext(_bytes16(context, builder, sig, args), _V16W)
        h = context.cast(builder, args[2], sig.args[2], types.boolean)
        n = builder.select(h, builder.lshr(v, _cw(4)), builder.and_(v, _cw(15)))
        return builder.add(n, _cw(k)) if k else n

    return H16(arr, idx, hi, off), cg


@intrinsic
def hq5(typingctx, arr, qs, qh, on, off):  # type: ignore[no-untyped-def]
    """The 32 five-bit values of a Q5_0/Q5_1 block as two ``H16`` (elements 0-15, 16-31): the nibbles
    of the 16 bytes at ``qs`` plus ``on`` where bit j of the 32 bits at ``qh`` is set, else ``off``
    (constants). Worked on 32 bytes at once, as llama.cpp's ``bytes_from_bits_32``, then widened."""
    if not (
        _is_bytes(arr)
        and isinstance(qs, types.Integer)
        and isinstance(qh, types.Integer)
        and isinstance(on, types.IntegerLiteral)
        and isinstance(off, types.IntegerLiteral)
    ):
        return None
    a, b = on.literal_value, off.literal_value
    ret = types.UniTuple(H16, 2)
    v32 = ir.VectorType(_I8, 32)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        q = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16B), align=1)
        c16 = ir.Constant(_V16B, [15] * 16)
        lo, hi = builder.and_(q, c16), builder.and_(builder.lshr(q, ir.Constant(_V16B, [4] * 16)), c16)
        nib = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        hb = builder.load(_ptr(context, builder, sig.args[0], args[0], args[2], sig.args[2], _I32), align=1)
        v8 = builder.bitcast(
            builder.insert_element(ir.Constant(ir.VectorType(_I32, 1), None), hb, ir.Constant(_I32, 0)),
            ir.VectorType(_I8, 4),
        )
        bytes_ = builder.shuffle_vector(
            v8,
            ir.Constant(ir.VectorType(_I8, 4), None),
            ir.Constant(ir.VectorType(_I32, 32), [i // 8 for i in range(32)]),
        )
        masks = ir.Constant(v32, [1 << (i % 8) for i in range(32)])
        set_ = builder.icmp_unsigned("!=", builder.and_(bytes_, masks), ir.Constant(v32, [0] * 32))
        val = builder.add(nib, builder.select(set_, ir.Constant(v32, [a] * 32), ir.Constant(v32, [b] * 32)))
        halves = [
            builder.sext(
                builder.shuffle_vector(val, val, ir.Constant(ir.VectorType(_I32, 16), list(r))), _V16W
            )
            for r in (range(16), range(16, 32))
        ]
        return context.make_tuple(builder, ret, halves)

    return ret(arr, qs, qh, on, off), cg


@intrinsic
def hload(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """arr[idx : idx + 16] of an int16 array."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int16 and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.load(
            _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16W), align=2
        )

    return H16(arr, idx), cg


@intrinsic
def hmadd(typingctx, acc, a, b):  # type: ignore[no-untyped-def]
    """acc + the 16 products a * b, summed in adjacent pairs into 8 lanes of 32 bits (``pmaddwd``)."""
    if acc != I32x8 or a != H16 or b != H16:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.add(args[0], _maddwd(builder, args[1], args[2]))

    return I32x8(acc, a, b), cg


@intrinsic
def imadd_pair(typingctx, acc, u, s, sc, k):  # type: ignore[no-untyped-def]
    """acc + the 32 products u * s (``isimd.imadd``'s ``pmaddubsw``) times the scales ``sc[2k]`` for the
    first 16 and ``sc[2k + 1]`` for the last 16 (``k`` a constant, ``sc`` an ``H16`` of 16 scales, e.g.
    ``hwiden`` of Q6_K's signed scale bytes): one shuffle of a vector loaded once per block, where
    ``isimd.imadd2`` builds the pair from two scalars on every call."""
    if acc != I32x8 or u != B32 or s != B32 or sc != H16 or not isinstance(k, types.IntegerLiteral):
        return None
    j = 2 * k.literal_value
    if not 0 <= j < 16:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        pair = builder.shuffle_vector(
            args[3], args[3], ir.Constant(ir.VectorType(_I32, 16), [j] * 8 + [j + 1] * 8)
        )
        return builder.add(args[0], _maddwd(builder, _maddubs(builder, args[1], args[2]), pair))

    return I32x8(acc, u, s, sc, k), cg


#: largest magnitude of a 16-bit activation (one less than int16's, so that -x never overflows)
Q16_MAX = 32767


@njit(cache=True)
def quantize_rows_q16(x, xq, xd, xs):
    """Quantize the rows of ``x`` (float32[M, K], K a multiple of 32) per 32-element block to 16 bits:
    ``xq`` int16[M, K] = rint(x / d), ``xd`` float32[M, K // 32] = d = max|x| / 32767 of the block, and
    ``xs`` float32[M, K // 32] = d times the sum of the block's quantized values (for the formats with
    a min: so that the kernels compute exactly W times the dequantized activations). Returns
    whether each row is finite (a block with an inf or NaN is quantized as zeros; the kernels then
    write NaN for that row). A block whose largest magnitude is below ~1e-34 (32767 / max|x| overflows)
    is quantized as zeros too: its contribution is below float32's resolution of any real sum, and
    ``x * inf`` would leave the integers undefined.

    The block's largest magnitude is an integer max over the float bits without the sign
    (``absmax_bits32``: they order as the magnitudes do; inf's and NaN's are above every finite one),
    8 lanes at a time, where a float max with a branch per element stayed scalar; the rounding
    (ggml's ``nearest_int``, ``quants._rowq._nearest_int``: the same integers as ``np.rint``, which
    was a libm call per element) and the sum vectorize too, with unsigned
    indices (a signed index's wraparound test per element kept LLVM from vectorizing). The bytes are
    the former loop's (checked over random, zero, subnormal, tie, inf and NaN blocks)."""
    M = x.shape[0]
    ok = np.ones(M, np.bool_)
    for m in range(M):
        xr, qr = x[m], xq[m]
        xb = xr.view(np.int32)
        for b in range(xd.shape[1]):  # the weight's blocks (x has at least as many elements)
            x0 = np.uint64(32 * b)
            abits = absmax_bits32(xb, x0)
            if abits >= 0x7F800000:  # an inf or a NaN
                ok[m] = False
                abits = 0
            amax = bitcast_f32(abits)
            inv = np.float32(Q16_MAX) / amax if abits else np.float32(np.inf)
            if not inv < np.inf:  # all zero, or so small (< 1e-34) that 32767 / max|x| overflows
                xd[m, b] = np.float32(0.0)
                xs[m, b] = np.float32(0.0)
                for j in range(np.uint64(32)):
                    qr[x0 + j] = 0
            else:
                d = amax / np.float32(Q16_MAX)
                xd[m, b] = d
                t = np.int32(0)
                for j in range(np.uint64(32)):
                    q = _nearest_int(xr[x0 + j] * inv)
                    qr[x0 + j] = np.int16(q)
                    t += q
                xs[m, b] = d * np.float32(t)
    return ok


@njit(inline="always")
def nan_rows(out, ok):
    """NaN over the output rows whose activation rows were not finite (``ok[m]`` False, from
    ``quantize_rows_q16`` or ``quantize_rows_q8_k``), in the calling kernel's serial part: a plain loop,
    no parallel region of its own."""
    for m in range(ok.shape[0]):
        if not ok[m]:
            for r in range(out.shape[1]):
                out[m, r] = np.nan
