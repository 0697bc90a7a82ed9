"""Integer vectors for Numba kernels: the 8-bit dot products of llama.cpp's x86 kernels.

llama.cpp multiplies quantized weights with activations quantized to 8 bits (``Q8_K`` for the
k-quants), so that 32 products of a block are two integer instructions: ``pmaddubsw`` (unsigned
bytes x signed bytes, adjacent pairs summed into 16 bits) and ``pmaddwd`` (times a 16-bit scale,
adjacent pairs summed into 32 bits). Floats then appear once per 256-element super-block. The float
kernels in ``matmul_kernels`` spend about one vector operation per weight unpacking and converting;
this way spends well under one per four.

Two Numba types: ``B32`` (32 bytes, ``<32 x i8>``) and ``I32x8`` (``<8 x i32>``). With AVX2 on the
host (and ``NUMBA_CPU_NAME`` unset or ``host``), or ``+avx2`` among ``NUMBA_CPU_FEATURES`` (a named AVX2
target, e.g. ``NUMBA_CPU_NAME=haswell``), ``imadd`` calls the two x86 instructions; elsewhere
it is the same arithmetic in generic LLVM vector IR (widen, multiply, add pairs), which gives the
same results because the kernels keep every 16-bit pair sum in range (weights 0..63, activations
-127..127: at most 16002).

Index arguments are element offsets into 1-D C-contiguous arrays and are not bounds-checked.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from .simd import V8, _is_bytes, _ptr, f32x8

__all__ = [
    "B32",
    "I32x8",
    "HAVE_AVX2",
    "bnib",
    "bq5",
    "bq6",
    "bload",
    "imadd",
    "imadd2",
    "izero",
    "ibar4",
    "iadd",
    "imul",
    "isra",
    "iload",
    "ib8",
    "itof",
    "ikscales",
]

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V32B = ir.VectorType(_I8, 32)
_V16W = ir.VectorType(_I16, 16)
_V8D = ir.VectorType(_I32, 8)


def _host_avx2() -> bool:
    from numba.core import config

    if config.CPU_FEATURES:  # an explicit target (e.g. NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx2,...)
        feats = config.CPU_FEATURES.split(",")
        return "+avx2" in feats and "-avx2" not in feats
    if (config.CPU_NAME or "host") != "host":
        return False  # another target was asked for, without its features: no x86-only instructions
    try:
        return bool(llvm.get_host_cpu_features().get("avx2", False))
    except RuntimeError:
        return False


#: whether ``imadd`` uses the x86 instructions (else generic IR, same results)
HAVE_AVX2 = _host_avx2()


class _B32(types.Type):
    def __init__(self) -> None:
        super().__init__(name="B32")


class _I32x8(types.Type):
    def __init__(self) -> None:
        super().__init__(name="I32x8")


B32 = _B32()
I32x8 = _I32x8()


@register_model(_B32)
class _B32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, _V32B)


@register_model(_I32x8)
class _I32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, _V8D)


def _splat(builder, vty, val):  # type: ignore[no-untyped-def]
    v = builder.insert_element(ir.Constant(vty, None), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(
        v, ir.Constant(vty, None), ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count)
    )


def _int_to(builder, val, ity, signed):  # type: ignore[no-untyped-def]
    if val.type.width > ity.width:
        return builder.trunc(val, ity)
    if val.type.width < ity.width:
        return builder.sext(val, ity) if signed else builder.zext(val, ity)
    return val


def _cb(v: int):  # type: ignore[no-untyped-def]
    return ir.Constant(_V32B, [v] * 32)


def _load32(context, builder, aty, arr, idx, ity):  # type: ignore[no-untyped-def]
    return builder.load(_ptr(context, builder, aty, arr, idx, ity, _V32B), align=1)


def _nibbles(context, builder, sig, args):  # type: ignore[no-untyped-def]
    q = _load32(context, builder, sig.args[0], args[0], args[1], sig.args[1])
    h = context.cast(builder, args[2], sig.args[2], types.boolean)
    return builder.select(h, builder.lshr(q, _cb(4)), builder.and_(q, _cb(15)))


@intrinsic
def bload(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 32 bytes at ``idx``."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _load32(context, builder, sig.args[0], args[0], args[1], sig.args[1])

    return B32(arr, idx), cg


@intrinsic
def bnib(typingctx, arr, idx, hi):  # type: ignore[no-untyped-def]
    """The low (``hi`` False) or high nibbles of the 32 bytes at ``idx``: 0..15."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    return B32(arr, idx, hi), _nibbles


def _with_high_bits(mask: int, doc: str):  # type: ignore[no-untyped-def]
    """An intrinsic ``f(arr, idx, hi, hidx, shift)``: the nibbles of the 32 bytes at ``idx`` (as
    ``bnib``) plus 16 times the bits ``(byte >> shift) & mask`` of the 32 bytes at ``hidx``."""

    @intrinsic
    def fn(typingctx, arr, idx, hi, hidx, shift):  # type: ignore[no-untyped-def]
        if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(shift, types.Integer)):
            return None

        def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
            nib = _nibbles(context, builder, sig, args)
            hb = _load32(context, builder, sig.args[0], args[0], args[3], sig.args[3])
            sh = _splat(builder, _V32B, _int_to(builder, args[4], _I8, False))
            return builder.or_(nib, builder.shl(builder.and_(builder.lshr(hb, sh), _cb(mask)), _cb(4)))

        return B32(arr, idx, hi, hidx, shift), cg

    fn.__doc__ = doc
    return fn


bq5 = _with_high_bits(1, "Q5_K: nibbles plus 16 times bit ``shift`` of the 32 bytes at ``hidx``: 0..31.")
bq6 = _with_high_bits(
    3, "Q6_K: nibbles plus bits ``shift``, ``shift + 1`` (times 16) of the bytes at ``hidx``: 0..63."
)


def _maddubs(builder, u, s):  # type: ignore[no-untyped-def]
    """<16 x i16>: u[2k] * s[2k] + u[2k+1] * s[2k+1] (u unsigned, s signed bytes)."""
    if HAVE_AVX2:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16W, [_V32B, _V32B]), "llvm.x86.avx2.pmadd.ub.sw"
        )
        return builder.call(fn, [u, s])
    p = builder.mul(builder.zext(u, ir.VectorType(_I16, 32)), builder.sext(s, ir.VectorType(_I16, 32)))
    even = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(_I32, 16), list(range(0, 32, 2))))
    odd = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(_I32, 16), list(range(1, 32, 2))))
    return builder.add(even, odd)


def _maddwd(builder, a, b):  # type: ignore[no-untyped-def]
    """<8 x i32>: a[2k] * b[2k] + a[2k+1] * b[2k+1] (signed 16-bit)."""
    if HAVE_AVX2:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V8D, [_V16W, _V16W]), "llvm.x86.avx2.pmadd.wd"
        )
        return builder.call(fn, [a, b])
    v16 = ir.VectorType(_I32, 16)
    p = builder.mul(builder.sext(a, v16), builder.sext(b, v16))
    even = builder.shuffle_vector(p, p, ir.Constant(_V8D, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(p, p, ir.Constant(_V8D, list(range(1, 16, 2))))
    return builder.add(even, odd)


def _scale16(builder, val, vty_sig):  # type: ignore[no-untyped-def]
    return _splat(builder, _V16W, _int_to(builder, val, _I16, vty_sig.signed))


@intrinsic
def imadd(typingctx, acc, u, s, scale):  # type: ignore[no-untyped-def]
    """acc + scale * (the 32 products u * s, summed four at a time into 8 lanes). ``u``: unsigned
    weights, ``s``: signed activations, ``scale``: an integer that fits 16 bits."""
    if acc != I32x8 or u != B32 or s != B32 or not isinstance(scale, types.Integer):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _maddwd(builder, _maddubs(builder, args[1], args[2]), _scale16(builder, args[3], sig.args[3]))
        return builder.add(args[0], p)

    return I32x8(acc, u, s, scale), cg


@intrinsic
def imadd2(typingctx, acc, u, s, s0, s1):  # type: ignore[no-untyped-def]
    """As ``imadd`` with scale ``s0`` for the first 16 products and ``s1`` for the last 16 (Q6_K)."""
    if acc != I32x8 or u != B32 or s != B32:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        a = _scale16(builder, args[3], sig.args[3])
        b = _scale16(builder, args[4], sig.args[4])
        sc = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 16), [0] * 8 + [16] * 8))
        return builder.add(args[0], _maddwd(builder, _maddubs(builder, args[1], args[2]), sc))

    return I32x8(acc, u, s, s0, s1), cg


@intrinsic
def izero(typingctx):  # type: ignore[no-untyped-def]
    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return ir.Constant(_V8D, None)

    return I32x8(), cg


def _ibinary(op):  # type: ignore[no-untyped-def]
    @intrinsic
    def fn(typingctx, a, b):  # type: ignore[no-untyped-def]
        if a != I32x8 or b != I32x8:
            return None

        def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return getattr(builder, op)(args[0], args[1])

        return I32x8(a, b), cg

    return fn


iadd = _ibinary("add")
imul = _ibinary("mul")


@intrinsic
def isra(typingctx, v, k):  # type: ignore[no-untyped-def]
    """``v >> k`` in each 32-bit lane, arithmetic (``k`` a constant 0..31): exact on multiples of ``2**k``."""
    if v != I32x8 or not isinstance(k, types.IntegerLiteral) or not 0 <= k.literal_value < 32:
        return None
    n = k.literal_value

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.ashr(args[0], ir.Constant(_V8D, [n] * 8))

    return I32x8(v, k), cg


@intrinsic
def iload(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """arr[idx : idx + 8] of an int32 array."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int32 and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V8D), align=4)

    return I32x8(arr, idx), cg


@intrinsic
def ib8(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 8 bytes at ``idx``, widened to 32 bits (sign-extended for an int8 array)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    signed = arr.dtype == types.int8

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 8))
        v = builder.load(p, align=1)
        return builder.sext(v, _V8D) if signed else builder.zext(v, _V8D)

    return I32x8(arr, idx), cg


@intrinsic
def itof(typingctx, v):  # type: ignore[no-untyped-def]
    """The 8 lanes as float32 (``simd.F32x8``)."""
    if v != I32x8:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.sitofp(args[0], V8)

    return f32x8(v), cg


@intrinsic
def ikscales(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 8 six-bit scales and the 8 mins of a Q4_K/Q5_K block from its 12 scale bytes at ``idx``
    (llama.cpp's ``get_scale_min_k4`` for j = 0..7, all lanes at once), as two ``I32x8``."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    ret = types.UniTuple(I32x8, 2)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 12))
        raw = builder.zext(builder.load(p, align=1), ir.VectorType(_I32, 12))

        def pick(lanes):  # type: ignore[no-untyped-def]
            return builder.shuffle_vector(raw, raw, ir.Constant(_V8D, lanes))

        def c(v):  # type: ignore[no-untyped-def]
            return ir.Constant(_V8D, [v] * 8)

        a = pick([0, 1, 2, 3, 0, 1, 2, 3])  # bytes 0-3 (scales 0-3; top bits of scales 4-7)
        m = pick([4, 5, 6, 7, 4, 5, 6, 7])  # bytes 4-7 (mins 0-3; top bits of mins 4-7)
        h = pick([8, 9, 10, 11, 8, 9, 10, 11])  # bytes 8-11 (low 4 bits of scales/mins 4-7)
        first = ir.Constant(ir.VectorType(ir.IntType(1), 8), [1, 1, 1, 1, 0, 0, 0, 0])
        top_a = builder.shl(builder.lshr(a, c(6)), c(4))
        top_m = builder.shl(builder.lshr(m, c(6)), c(4))
        sc = builder.select(first, builder.and_(a, c(63)), builder.or_(builder.and_(h, c(15)), top_a))
        mn = builder.select(first, builder.and_(m, c(63)), builder.or_(builder.lshr(h, c(4)), top_m))
        return context.make_tuple(builder, ret, [sc, mn])

    return ret(arr, idx), cg


@intrinsic
def ilane(typingctx, v, k):  # type: ignore[no-untyped-def]
    """Lane ``k`` of ``v`` as an int32 (with ``k`` a loop index LLVM unrolls, a constant shuffle)."""
    if v != I32x8 or not isinstance(k, types.Integer):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))

    return types.int32(v, k), cg


@intrinsic
def ibar4(typingctx, s0, s1, s2, s3):  # type: ignore[no-untyped-def]
    """The four sums unchanged, through an empty ``asm`` that LLVM cannot look into: the products of a
    run for all rows are done before the next run's start, so the scheduler does not regroup the
    unrolled runs row by row (which keeps eight unpacked runs and scales alive: spills). Identity
    where there is no AVX2."""
    if not all(v == I32x8 for v in (s0, s1, s2, s3)):
        return None
    ret = types.UniTuple(I32x8, 4)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        if not HAVE_AVX2:
            return context.make_tuple(builder, ret, list(args))
        vt = args[0].type
        st = ir.LiteralStructType([vt] * 4)
        r = builder.asm(ir.FunctionType(st, [vt] * 4), "", "=x,=x,=x,=x,0,1,2,3", list(args), True)
        return context.make_tuple(builder, ret, [builder.extract_value(r, i) for i in range(4)])

    return ret(s0, s1, s2, s3), cg
