"""The MXFP4 mat-vec kernel (gpt-oss's experts): a few activation rows times the weight, decoding the
E2M1 nibbles in registers (never a float copy of the weight). ``MATVEC["MXFP4"]`` in
``matmul_kernels``, so ``mul_mat`` and the experts' ``mul_mat_id`` both use it for up to
``MATVEC_MAX_TOKENS`` rows; larger batches dequantize tiles (``quants.mxfp4``) for sgemm.

Layout: ``quants.mxfp4``. Per 32-element block: one E8M0 byte (the scale ``2**(e - 128)``, a table
lookup) and 16 bytes of nibbles. ``vfp4`` turns the low or high nibbles of 8 bytes into their 8
doubled E2M1 values: with AVX2 one ``vpermps`` (the 8 magnitudes are a register-resident table)
plus the sign bit; elsewhere (``vfp4_portable``) the float32 bits are assembled with integer vector
operations (a nibble ``s e1 e0 m`` is sign ``s``, exponent ``e``, one mantissa bit ``m``; ``e == 0``:
the subnormal ``m``). The activations stay float32 (llama.cpp rounds them to Q8_0 for this dot
product; here the products are exact and only the summation order differs from the reference).

The rest is ``matmul_kernels``' scheme: ``simd.F32x8`` accumulators per row across all blocks, four
rows per pass sharing the loaded activations, the block scale applied to each block's 8-lane partial
sum, prefetch of the rows ahead, ``prange`` over groups of four rows.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._numba import njit
from ..quants.mxfp4 import E8M0_HALF
from .isimd import HAVE_AVX2
from .rowgroups import matvec_float
from .simd import V8, _bytes8, _c8, _I32x8, _is_bytes, f32x8, vfma, vload, vmul, vsplat

__all__ = ["mm_mxfp4", "vfp4", "vfp4_portable"]


def _nibbles(context, builder, sig, args):  # type: ignore[no-untyped-def]
    q = _bytes8(context, builder, sig, args)
    h = context.cast(builder, args[2], sig.args[2], types.boolean)
    return builder.and_(builder.select(h, builder.lshr(q, _c8([4] * 8)), q), _c8([15] * 8))


def _fp4_permps(builder, n):  # type: ignore[no-untyped-def]
    """AVX2 ``vpermps``: the 8 magnitudes as a register-resident table, indexed by ``n & 7``."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(V8, [V8, _I32x8]), "llvm.x86.avx2.permps"
    )
    table = ir.Constant(V8, [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0])
    mag = builder.call(fn, [table, builder.and_(n, _c8([7] * 8))])
    sign = builder.shl(builder.and_(n, _c8([8] * 8)), _c8([28] * 8))
    return builder.bitcast(builder.or_(builder.bitcast(mag, _I32x8), sign), V8)


def _fp4_bits(builder, n):  # type: ignore[no-untyped-def]
    """Generic IR: a nibble ``s e1 e0 m`` is 2**e * (1 + m/2) (biased exponent e + 127, mantissa bit 22)
    for e > 0 and m (0.0 or 1.0) for e == 0, with sign s."""
    sign = builder.shl(builder.and_(n, _c8([8] * 8)), _c8([28] * 8))
    e = builder.and_(builder.lshr(n, _c8([1] * 8)), _c8([3] * 8))
    m = builder.and_(n, _c8([1] * 8))
    normal = builder.or_(
        builder.shl(builder.add(e, _c8([127] * 8)), _c8([23] * 8)), builder.shl(m, _c8([22] * 8))
    )
    sub = builder.and_(builder.sub(_c8([0] * 8), m), _c8([127 << 23] * 8))
    is_sub = builder.icmp_unsigned("==", e, _c8([0] * 8))
    return builder.bitcast(builder.or_(builder.select(is_sub, sub, normal), sign), V8)


def _fp4_intrinsic(decode, doc: str):  # type: ignore[no-untyped-def]
    @intrinsic
    def fn(typingctx, arr, idx, hi):  # type: ignore[no-untyped-def]
        if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
            return None

        def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
            return decode(builder, _nibbles(context, builder, sig, args))

        return f32x8(arr, idx, hi), cg

    fn.__doc__ = doc
    return fn


#: the low (``hi`` False) or high nibbles of the 8 bytes at ``arr[idx]`` as doubled E2M1 values
#: (``kvalues_mxfp4``: 0, 1, 2, 3, 4, 6, 8, 12, then negated), as 8 floats: ``vpermps`` with AVX2
vfp4 = _fp4_intrinsic(_fp4_permps if HAVE_AVX2 else _fp4_bits, "8 nibbles as doubled E2M1 floats")
#: the same in generic LLVM IR on every target (what ``vfp4`` is without AVX2; tested on all hosts)
vfp4_portable = _fp4_intrinsic(_fp4_bits, "8 nibbles as doubled E2M1 floats (generic IR)")


@njit(inline="always")
def _blk(wr, q, x0, x1, x2, x3):
    """sum of value * x over one block's 16 bytes of nibbles at ``q`` (low nibbles: elements 0-15)."""
    t = vmul(vfp4(wr, q, False), x0)
    t = vfma(t, vfp4(wr, q + 8, False), x1)
    t = vfma(t, vfp4(wr, q, True), x2)
    return vfma(t, vfp4(wr, q + 8, True), x3)


@njit(inline="always")
def _mx_row(acc, wr, o, xm, xe, f16):
    """One MXFP4 block (``o``: its E8M0 scale byte, then 16 bytes of nibbles) against ``xm[xe:xe + 32]``."""
    t = _blk(wr, o + 1, vload(xm, xe), vload(xm, xe + 8), vload(xm, xe + 16), vload(xm, xe + 24))
    return vfma(acc, vsplat(E8M0_HALF[wr[o]]), t)


@njit(parallel=True, cache=True, fastmath=True)
def mm_mxfp4(w, x, out, f16):
    """``MATVEC`` entry: ``out[m, r] = sum_k W[r, k] * x[m, k]`` for the MXFP4 weight ``w`` (``uint8[N,
    17 * K / 32]``, C-contiguous), ``x float32[M, K]``, ``out float32[M, N]`` (``f16`` unused: the
    scales are E8M0, looked up in ``E8M0_HALF``)."""
    matvec_float(w, x, out, f16, _mx_row, 17, 32)
