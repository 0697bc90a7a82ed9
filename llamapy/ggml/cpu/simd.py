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
bit tricks vectorize), ``absmax_bits32`` (a block's largest magnitude as bits), ``u16at`` (an
unaligned 16-bit load).

``vh8`` takes 8 half-float bit patterns (a ``uint16`` array) and returns them as floats: LLVM's
``fpext`` from ``<8 x half>``, one ``vcvtph2ps`` where the target has F16C.

``vq4`` (nibbles) and ``vi8`` (signed bytes) take 8 consecutive bytes starting at ``i`` and return
their 8 values as floats, so a 32-byte run of quants is four calls. Integer vectors (8-bit dot
products, for the k-quants) are in ``isimd``.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = [
    "absmax_bits32",
    "bitcast_f32",
    "prefetch",
    "prefetch_l1",
    "f32x8",
    "vzero",
    "vload",
    "vstore",
    "vsplat",
    "vadd",
    "vadd_strict",
    "vsub_strict",
    "vmul_strict",
    "vfma_strict",
    "vsub",
    "vmul",
    "vfma",
    "vhsum",
    "vi8",
    "vq4",
    "vh8",
    "u16at",
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
def vstore(typingctx, arr, idx, v):  # type: ignore[no-untyped-def]
    """arr[idx : idx + 8] = v for a float32 array."""
    if not (
        isinstance(arr, types.Array)
        and arr.dtype == types.float32
        and isinstance(idx, types.Integer)
        and v == f32x8
    ):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        builder.store(
            args[2], _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], V8), align=4
        )
        return context.get_dummy_value()

    return types.void(arr, idx, v), cg


@intrinsic
def vsplat(typingctx, x):  # type: ignore[no-untyped-def]
    if not isinstance(x, types.Float):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        vec = builder.insert_element(ir.Constant(V8, None), v, ir.Constant(_I32, 0))
        return builder.shuffle_vector(vec, ir.Constant(V8, None), ir.Constant(_I32x8, [0] * 8))

    return f32x8(x), cg


def _binary(op, flags=_FAST):  # type: ignore[no-untyped-def]
    @intrinsic
    def fn(typingctx, a, b):  # type: ignore[no-untyped-def]
        if a != f32x8 or b != f32x8:
            return None

        def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return getattr(builder, op)(args[0], args[1], flags=flags)

        return f32x8(a, b), cg

    return fn


vadd = _binary("fadd")
vsub = _binary("fsub")
vmul = _binary("fmul")


# The same without fast-math flags: LLVM computes these as written. A kernel that reuses one value in
# several unrolled copies of a loop body (one per activation row) builds that value and each row's
# partial sum with these, so that LLVM cannot fold them differently into each copy: equal rows then
# round equally wherever they sit in the batch.
vadd_strict = _binary("fadd", ())
vsub_strict = _binary("fsub", ())
vmul_strict = _binary("fmul", ())


@intrinsic
def vfma_strict(typingctx, acc, a, b):  # type: ignore[no-untyped-def]
    """acc + a * b rounded once (``llvm.fma``; no fast-math flags)."""
    if acc != f32x8 or a != f32x8 or b != f32x8:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(V8, [V8, V8, V8]), "llvm.fma.v8f32"
        )
        return builder.call(fn, [args[1], args[2], args[0]])

    return f32x8(acc, a, b), cg


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
def vh8(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """arr[idx : idx + 8] of a uint16 array of half-float bits, as floats."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint16 and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        h8 = ir.VectorType(ir.HalfType(), 8)
        return builder.fpext(
            builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], h8), align=2), V8
        )

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
def u16at(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The little-endian uint16 at byte ``idx`` of a byte array (one unaligned load)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.IntType(16))
        return builder.zext(builder.load(p, align=1), ir.IntType(64))

    return types.int64(arr, idx), cg


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
def absmax_bits32(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The largest ``bits & 0x7FFFFFFF`` over the 32 int32 at ``idx`` of ``arr``: for float bits, the
    largest magnitude's bits (they order as the magnitudes do; inf's and NaN's above every finite one).
    Four loads, ands and unsigned maxes of 8 lanes and a 3-step horizontal max: LLVM leaves the same
    reduction written as a loop as 31 scalar steps."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int32 and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        vt = ir.VectorType(i32, 8)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], vt)
        mask = ir.Constant(vt, [0x7FFFFFFF] * 8)

        def umax(a, b):  # type: ignore[no-untyped-def]
            return builder.select(builder.icmp_unsigned(">", a, b), a, b)

        acc = None
        for k in range(4):
            v = builder.and_(builder.load(builder.gep(p, [ir.Constant(ir.IntType(64), k)]), align=4), mask)
            acc = v if acc is None else umax(acc, v)
        for half in (4, 2, 1):
            hi = builder.shuffle_vector(
                acc, ir.Constant(vt, None), ir.Constant(vt, [(i + half) % 8 for i in range(8)])
            )
            acc = umax(acc, hi)
        return builder.extract_element(acc, ir.Constant(i32, 0))

    return types.int32(arr, idx), cg


#: LLVM's locality of the weight prefetches: 2 is ``prefetcht1`` (into L2). Into L1 (3, ``prefetcht0``)
#: each of the ~9 lines a 4-row block pass asks for holds one of L1's few miss buffers until it arrives,
#: so the rows ahead arrive late: a one-row decode from DRAM (AMD EPYC Zen 4 class, one thread,
#: ``benchmarks/matvec_dram.py``) read Q4_K at 8.5-14.6 GB/s and Q6_K at 8.2-11.6 with t0, 12.9-17.8
#: and 12.5-21.9 with t1; the whole Qwen2.5-1.5B-shaped Q4_K_M decode went from 113-116 to 84-94 ms per
#: token (``benchmarks/tg_cputime.py``). A model that fits in L3 (SmolLM2-135M) lost ~7 % (10.2-10.7 ->
#: 11.3-11.6 ms per token): its lines come from L3, where t0's shorter wait mattered more. Such models run
#: the ``*_l1`` kernel variants (``prefetch_l1``), chosen per weight by its model's size in
#: ``matmul_steps`` (``L1_PREFETCH_MAX_BYTES``).
PREFETCH_LOCALITY = 2
#: the locality of ``prefetch_l1``: 3 is ``prefetcht0`` (into L1)
PREFETCH_LOCALITY_L1 = 3


def _prefetch_intrinsic(locality: int, name: str, where: str):  # type: ignore[no-untyped-def]
    def prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
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
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.void(arr, idx), codegen

    prefetch.__doc__ = (
        f"Hint the CPU to fetch the cache line of ``arr.flat[idx]`` (a C-contiguous 1-D array) for "
        f"reading, {where}. Never faults, even out of bounds; the kernels still keep ``idx`` in bounds."
    )
    prefetch.__name__ = prefetch.__qualname__ = name
    return intrinsic(prefetch)


#: a cache-line hint into L2 (``PREFETCH_LOCALITY``: ``prefetcht1``)
prefetch = _prefetch_intrinsic(PREFETCH_LOCALITY, "prefetch", "into L2 (``prefetcht1``)")
#: a cache-line hint into L1 (``PREFETCH_LOCALITY_L1``: ``prefetcht0``)
prefetch_l1 = _prefetch_intrinsic(PREFETCH_LOCALITY_L1, "prefetch_l1", "into L1 (``prefetcht0``)")
