"""An 8 x float32 vector value for Numba kernels, and the few operations the mat-vec kernels need.

Why: written as scalar loops, a block dot product ends in a horizontal sum per block and row (LLVM
vectorizes only the innermost loop and reduces at its exit), which costs as much as the products for
32-element blocks. With ``F32x8`` values the kernels keep eight partial sums per row in a register
across all blocks, apply each block's scale to the whole vector, and sum horizontally once per row,
as llama.cpp's hand-written AVX2 dot products do.

The operations are generic LLVM vector IR (no x86 intrinsics): LLVM lowers them to AVX2 here and to
two 128-bit halves on SSE or NEON. Loads are unaligned; index arguments are element offsets into 1-D
C-contiguous arrays and are not bounds-checked (the kernels keep them in bounds).

Also scalar helpers: ``prefetch`` (a cache-line hint), ``bitcast_f32`` (int bits -> float32, so that
bit tricks vectorize), ``u16at`` (an unaligned 16-bit load), ``bits32`` (one bit of 32 bytes as a mask).

Bit unpacking (``vq4``, ``vq5k``, ``vq6``) takes 8 consecutive bytes starting at ``i`` and returns
their 8 values as floats, so a 32-byte run of quants is four calls.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = [
    "bitcast_f32",
    "prefetch",
    "f32x8",
    "vzero",
    "vload",
    "vsplat",
    "vadd",
    "vsub",
    "vmul",
    "vfma",
    "vhsum",
    "vi8",
    "vq4",
    "vq5k",
    "vq6",
    "u16at",
    "vlane",
    "vkscales",
    "bits32",
]

_F = ir.FloatType()
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
V8 = ir.VectorType(_F, 8)
_I8x8 = ir.VectorType(_I8, 8)
_I32x8 = ir.VectorType(_I32, 8)
_FAST = ("fast",)


class F32x8(types.Type):
    def __init__(self) -> None:
        super().__init__(name="F32x8")


f32x8 = F32x8()


@register_model(F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, V8)


def _ptr(context, builder, aty, arr, idx, ity, elem):  # type: ignore[no-untyped-def]
    ary = context.make_array(aty)(context, builder, arr)
    i = context.cast(builder, idx, ity, types.intp)
    return builder.bitcast(builder.gep(ary.data, [i]), elem.as_pointer())


def _i32x8(builder, val, signed):  # type: ignore[no-untyped-def]
    """An integer scalar (any width) splatted to <8 x i32>."""
    if val.type.width > 32:
        val = builder.trunc(val, _I32)
    elif val.type.width < 32:
        val = builder.sext(val, _I32) if signed else builder.zext(val, _I32)
    v = builder.insert_element(ir.Constant(_I32x8, None), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_I32x8, None), ir.Constant(_I32x8, [0] * 8))


def _c8(vals):  # type: ignore[no-untyped-def]
    return ir.Constant(_I32x8, list(vals))


def _bytes8(context, builder, sig, args):  # type: ignore[no-untyped-def]
    """The 8 bytes at args[1] of the array args[0], zero-extended to <8 x i32>."""
    p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I8x8)
    return builder.zext(builder.load(p, align=1), _I32x8)


def _is_bytes(arr) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(arr, types.Array) and arr.dtype in (types.uint8, types.int8)


@intrinsic
def vzero(typingctx):  # type: ignore[no-untyped-def]
    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return ir.Constant(V8, None)

    return f32x8(), cg


@intrinsic
def vload(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """arr[idx : idx + 8] of a float32 array."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], V8), align=4)

    return f32x8(arr, idx), cg


@intrinsic
def vsplat(typingctx, x):  # type: ignore[no-untyped-def]
    if not isinstance(x, types.Float):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        vec = builder.insert_element(ir.Constant(V8, None), v, ir.Constant(_I32, 0))
        return builder.shuffle_vector(vec, ir.Constant(V8, None), ir.Constant(_I32x8, [0] * 8))

    return f32x8(x), cg


def _binary(op):  # type: ignore[no-untyped-def]
    @intrinsic
    def fn(typingctx, a, b):  # type: ignore[no-untyped-def]
        if a != f32x8 or b != f32x8:
            return None

        def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return getattr(builder, op)(args[0], args[1], flags=_FAST)

        return f32x8(a, b), cg

    return fn


vadd = _binary("fadd")
vsub = _binary("fsub")
vmul = _binary("fmul")


@intrinsic
def vfma(typingctx, acc, a, b):  # type: ignore[no-untyped-def]
    """acc + a * b (contracted to one FMA where the CPU has it)."""
    if acc != f32x8 or a != f32x8 or b != f32x8:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.fadd(args[0], builder.fmul(args[1], args[2], flags=_FAST), flags=_FAST)

    return f32x8(acc, a, b), cg


@intrinsic
def vhsum(typingctx, v):  # type: ignore[no-untyped-def]
    """The sum of the 8 lanes."""
    if v != f32x8:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        x = args[0]
        v4 = ir.VectorType(_F, 4)
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7]))
        s = builder.fadd(lo, hi, flags=_FAST)
        s2 = builder.fadd(
            s,
            builder.shuffle_vector(
                s, ir.Constant(v4, None), ir.Constant(ir.VectorType(_I32, 4), [2, 3, 2, 3])
            ),
        )
        a = builder.extract_element(s2, ir.Constant(_I32, 0))
        b = builder.extract_element(s2, ir.Constant(_I32, 1))
        return builder.fadd(a, b, flags=_FAST)

    return types.float32(v), cg


@intrinsic
def vi8(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """8 signed bytes (Q8_0 quants) as floats."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I8x8)
        return builder.sitofp(builder.sext(builder.load(p, align=1), _I32x8), V8)

    return f32x8(arr, idx), cg


@intrinsic
def vq4(typingctx, arr, idx, hi):  # type: ignore[no-untyped-def]
    """The low (``hi`` False) or high nibbles of 8 bytes, as floats 0..15."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        q = _bytes8(context, builder, sig, args)
        h = context.cast(builder, args[2], sig.args[2], types.boolean)
        v = builder.select(h, builder.lshr(q, _c8([4] * 8)), builder.and_(q, _c8([15] * 8)))
        return builder.sitofp(v, V8)

    return f32x8(arr, idx, hi), cg


@intrinsic
def vq5k(typingctx, arr, idx, hi, harr, hidx, bit):  # type: ignore[no-untyped-def]
    """Q5_K: nibbles of 8 bytes at ``idx`` (as ``vq4``) plus 16 times bit ``bit`` of the 8 bytes at
    ``hidx`` of ``harr``, as floats 0..31."""
    if not (_is_bytes(arr) and _is_bytes(harr)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        q = _bytes8(context, builder, sig, args)
        h = context.cast(builder, args[2], sig.args[2], types.boolean)
        nib = builder.select(h, builder.lshr(q, _c8([4] * 8)), builder.and_(q, _c8([15] * 8)))
        hp = _ptr(context, builder, sig.args[3], args[3], args[4], sig.args[4], _I8x8)
        hb = builder.zext(builder.load(hp, align=1), _I32x8)
        sh = _i32x8(builder, args[5], sig.args[5].signed)
        b5 = builder.shl(builder.and_(builder.lshr(hb, sh), _c8([1] * 8)), _c8([4] * 8))
        return builder.sitofp(builder.or_(nib, b5), V8)

    return f32x8(arr, idx, hi, harr, hidx, bit), cg


@intrinsic
def vq6(typingctx, arr, idx, hi, hidx, shift):  # type: ignore[no-untyped-def]
    """Q6_K: the low/high nibbles of the 8 bytes at ``idx`` with 2 more bits from the 8 bytes at
    ``hidx`` (bits ``shift``, ``shift + 1``): floats 0..63 (the -32 offset is left to the caller)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        q = _bytes8(context, builder, sig, args)
        h = context.cast(builder, args[2], sig.args[2], types.boolean)
        nib = builder.select(h, builder.lshr(q, _c8([4] * 8)), builder.and_(q, _c8([15] * 8)))
        hp = _ptr(context, builder, sig.args[0], args[0], args[3], sig.args[3], _I8x8)
        hb = builder.zext(builder.load(hp, align=1), _I32x8)
        sh = _i32x8(builder, args[4], sig.args[4].signed)
        b2 = builder.shl(builder.and_(builder.lshr(hb, sh), _c8([3] * 8)), _c8([4] * 8))
        return builder.sitofp(builder.or_(nib, b2), V8)

    return f32x8(arr, idx, hi, hidx, shift), cg


@intrinsic
def u16at(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The little-endian uint16 at byte ``idx`` of a byte array (one unaligned load)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.IntType(16))
        return builder.zext(builder.load(p, align=1), ir.IntType(64))

    return types.int64(arr, idx), cg


@intrinsic
def vlane(typingctx, v, k):  # type: ignore[no-untyped-def]
    """All 8 lanes set to lane ``k`` of ``v``."""
    if v != f32x8 or not isinstance(k, types.Integer):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        i = context.cast(builder, args[1], sig.args[1], types.int32)
        e = builder.extract_element(args[0], i)
        vec = builder.insert_element(ir.Constant(V8, None), e, ir.Constant(_I32, 0))
        return builder.shuffle_vector(vec, ir.Constant(V8, None), ir.Constant(_I32x8, [0] * 8))

    return f32x8(v, k), cg


@intrinsic
def vkscales(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 8 six-bit scales and the 8 mins of a Q4_K/Q5_K block, from its 12 scale bytes at ``idx``
    (llama.cpp's ``get_scale_min_k4`` for j = 0..7, all lanes at once): a tuple of two vectors."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    ret = types.UniTuple(f32x8, 2)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 12))
        raw = builder.zext(builder.load(p, align=1), ir.VectorType(_I32, 12))

        def pick(lanes):  # type: ignore[no-untyped-def]
            return builder.shuffle_vector(raw, raw, ir.Constant(_I32x8, lanes))

        a = pick([0, 1, 2, 3, 0, 1, 2, 3])  # bytes 0-3 (scales 0-3; top bits of scales 4-7)
        m = pick([4, 5, 6, 7, 4, 5, 6, 7])  # bytes 4-7 (mins 0-3; top bits of mins 4-7)
        h = pick([8, 9, 10, 11, 8, 9, 10, 11])  # bytes 8-11 (low 4 bits of scales/mins 4-7)
        first = ir.Constant(ir.VectorType(ir.IntType(1), 8), [1, 1, 1, 1, 0, 0, 0, 0])
        top_a = builder.shl(builder.lshr(a, _c8([6] * 8)), _c8([4] * 8))
        top_m = builder.shl(builder.lshr(m, _c8([6] * 8)), _c8([4] * 8))
        sc = builder.select(
            first, builder.and_(a, _c8([63] * 8)), builder.or_(builder.and_(h, _c8([15] * 8)), top_a)
        )
        mn = builder.select(
            first, builder.and_(m, _c8([63] * 8)), builder.or_(builder.lshr(h, _c8([4] * 8)), top_m)
        )
        return context.make_tuple(builder, ret, [builder.sitofp(sc, V8), builder.sitofp(mn, V8)])

    return ret(arr, idx), cg


@intrinsic
def bits32(typingctx, arr, idx, bit):  # type: ignore[no-untyped-def]
    """Bit ``bit`` of each of the 32 bytes at ``idx``, packed into an integer (byte l -> bit l; a
    compare and a byte mask, ``pmovmskb`` on x86)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(bit, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v32 = ir.VectorType(_I8, 32)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], v32)
        q = builder.load(p, align=1)
        b = context.cast(builder, args[2], sig.args[2], types.int64)
        one = builder.trunc(builder.shl(ir.Constant(ir.IntType(64), 1), b), _I8)
        m = builder.shuffle_vector(
            builder.insert_element(ir.Constant(v32, None), one, ir.Constant(_I32, 0)),
            ir.Constant(v32, None),
            ir.Constant(ir.VectorType(_I32, 32), [0] * 32),
        )
        bits = builder.icmp_unsigned("!=", builder.and_(q, m), ir.Constant(v32, None))
        return builder.zext(builder.bitcast(bits, _I32), ir.IntType(64))

    return types.int64(arr, idx, bit), cg


@intrinsic
def bitcast_f32(typingctx, v):  # type: ignore[no-untyped-def]
    """The float32 whose bits are the low 32 bits of the integer ``v`` (vectorizes, unlike a view
    through an array)."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        x = args[0]
        if x.type.width > 32:
            x = builder.trunc(x, i32)
        elif x.type.width < 32:
            x = builder.sext(x, i32) if signature.args[0].signed else builder.zext(x, i32)
        return builder.bitcast(x, ir.FloatType())

    return types.float32(v), codegen


@intrinsic
def prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """Hint the CPU to fetch the cache line of ``arr.flat[idx]`` (a C-contiguous 1-D array) for reading.
    Never faults, even out of bounds; the kernels still keep ``idx`` in bounds."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(ary.data, [i]), i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen
