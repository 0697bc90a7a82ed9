"""Vector helpers of the 8-row interleaved Q4_K kernel (``q4k_x8_kernels``): eight weight rows in the
eight 32-bit lanes of one register.

With 4 bytes of each of 8 rows in one 32-byte register and the same 4 activation bytes broadcast to all
eight lanes, ``pmaddubsw`` gives each row's two pair sums in its own pair of 16-bit lanes; a sub-block's
eight such products add up in 16 bits (at most 8 x 2 x 15 x 127 = 30480), and one ``pmaddwd`` by the
rows' sub-block scales (each scale in both 16-bit lanes of its row) leaves one 32-bit sum per row: no
horizontal sums, and the scales are applied once per 32 x 8 weights instead of once per 32.

Types: ``isimd.B32`` (32 bytes), ``hsimd.H16`` (16 x int16), ``isimd.I32x8``, ``simd.F32x8``. The
multiplies are ``isimd``'s (x86 instructions where ``isimd.HAVE_AVX2``, else the same arithmetic in
generic IR). Index arguments are element offsets into 1-D C-contiguous arrays, not bounds-checked.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .hsimd import H16
from .isimd import B32, I32x8, _maddubs, _maddwd
from .simd import V8, _is_bytes, _ptr, f32x8

__all__ = ["xbcast4", "xmaddubs", "xadd16", "xzero16", "xscale", "xmins", "xh8"]

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V32B = ir.VectorType(_I8, 32)
_V16W = ir.VectorType(_I16, 16)
_V8D = ir.VectorType(_I32, 8)


@intrinsic
def xbcast4(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 4 bytes at ``idx`` repeated 8 times (``vpbroadcastd``)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I32)
        v = builder.load(p, align=1)
        vec = builder.insert_element(ir.Constant(_V8D, None), v, ir.Constant(_I32, 0))
        vec = builder.shuffle_vector(vec, ir.Constant(_V8D, None), ir.Constant(_V8D, [0] * 8))
        return builder.bitcast(vec, _V32B)

    return B32(arr, idx), cg


@intrinsic
def xmaddubs(typingctx, u, s):  # type: ignore[no-untyped-def]
    """u[2k] * s[2k] + u[2k+1] * s[2k+1] in 16 bits (``u`` unsigned bytes, ``s`` signed)."""
    if u != B32 or s != B32:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _maddubs(builder, args[0], args[1])

    return H16(u, s), cg


@intrinsic
def xadd16(typingctx, a, b):  # type: ignore[no-untyped-def]
    if a != H16 or b != H16:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.add(args[0], args[1])

    return H16(a, b), cg


@intrinsic
def xzero16(typingctx):  # type: ignore[no-untyped-def]
    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return ir.Constant(_V16W, None)

    return H16(), cg


@intrinsic
def xscale(typingctx, acc, s, arr, idx):  # type: ignore[no-untyped-def]
    """acc + (each row's two 16-bit lanes of ``s`` summed and times the row's scale): the 8 scale bytes
    at ``idx`` (unsigned, row r's in lanes 2r and 2r + 1)."""
    if acc != I32x8 or s != H16 or not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[2], args[2], args[3], sig.args[3], ir.VectorType(_I8, 8))
        b8 = builder.load(p, align=1)
        dup = builder.shuffle_vector(
            b8,
            ir.Constant(ir.VectorType(_I8, 8), None),
            ir.Constant(ir.VectorType(_I32, 16), [i // 2 for i in range(16)]),
        )
        return builder.add(args[0], _maddwd(builder, args[1], builder.zext(dup, _V16W)))

    return I32x8(acc, s, arr, idx), cg


@intrinsic
def xmins(typingctx, acc, arr, idx, pair):  # type: ignore[no-untyped-def]
    """acc + per row r: ``m[2r] * lo(pair) + m[2r + 1] * hi(pair)`` with ``m`` the 16 unsigned bytes at
    ``idx`` and ``pair`` an int32 holding two int16 (the low half first)."""
    if acc != I32x8 or not (
        _is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(pair, types.Integer)
    ):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[1], args[1], args[2], sig.args[2], ir.VectorType(_I8, 16))
        m = builder.zext(builder.load(p, align=1), _V16W)
        v = context.cast(builder, args[3], sig.args[3], types.int32)
        vec = builder.insert_element(ir.Constant(_V8D, None), v, ir.Constant(_I32, 0))
        vec = builder.shuffle_vector(vec, ir.Constant(_V8D, None), ir.Constant(_V8D, [0] * 8))
        return builder.add(args[0], _maddwd(builder, m, builder.bitcast(vec, _V16W)))

    return I32x8(acc, arr, idx, pair), cg


def _host_f16c() -> bool:
    from numba.core import config

    if config.CPU_FEATURES:
        feats = config.CPU_FEATURES.split(",")
        return "+f16c" in feats and "-f16c" not in feats
    if (config.CPU_NAME or "host") != "host":
        return False
    try:
        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except RuntimeError:
        return False


#: whether ``xh8`` is LLVM's ``fpext`` from half (one ``vcvtph2ps``); else integer IR (same values: a
#: target without F16C has no half conversion LLVM can call)
HAVE_F16C = _host_f16c()


def _half_bits_to_float(builder, h):  # type: ignore[no-untyped-def]
    """<8 x i16> half bits -> <8 x float>, exactly (normals, subnormals, inf, NaN) in integer IR."""

    def c(v):  # type: ignore[no-untyped-def]
        return ir.Constant(_V8D, [v] * 8)

    x = builder.zext(h, _V8D)
    sign = builder.shl(builder.and_(x, c(0x8000)), c(16))
    em = builder.and_(x, c(0x7FFF))
    sh = builder.shl(em, c(13))
    # exponent rebias by a multiply by 2^112 (also makes subnormal halves normal floats)
    f = builder.fmul(builder.bitcast(sh, V8), builder.bitcast(c(0x77800000), V8))
    special = builder.icmp_unsigned(">=", em, c(0x7C00))
    fb = builder.select(special, builder.or_(sh, c(0x7F800000)), builder.bitcast(f, _V8D))
    return builder.bitcast(builder.or_(fb, sign), V8)


@intrinsic
def xh8(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 8 half floats at byte ``idx`` of a byte array, as floats (``vcvtph2ps`` with F16C)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        if HAVE_F16C:
            h8 = ir.VectorType(ir.HalfType(), 8)
            p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], h8)
            return builder.fpext(builder.load(p, align=1), V8)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I16, 8))
        return _half_bits_to_float(builder, builder.load(p, align=1))

    return f32x8(arr, idx), cg
