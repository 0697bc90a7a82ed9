"""Mat-vec kernels for the non-linear 4-bit types IQ4_NL (32-element blocks) and IQ4_XS (256-element
super-blocks with a 6-bit scale per 32): each nibble indexes the 16-entry table ``kvalues_iq4nl``.

Built as the 32-element kernels of ``matmul_kernels`` (float activations as they are, ``F32x8``
accumulators, four weight rows per pass, prefetch, ``prange`` over row groups); the only new piece is
``vnl4``, the table lookup of a block's 32 nibbles as floats: one ``vpshufb`` on AVX2 (32 lane extracts
from a constant vector elsewhere: same values), then four sign-extensions and conversions, as many
operations as ``vq4``'s unpacking of Q4_0.

IQ4_NL is llama.cpp's fallback type for rows that are not a multiple of 256 in Q2_K/Q3_K/IQ4_XS mixes.
Call as ``MATVEC``: ``kern(w, x, out, f16)``; K a multiple of 32 (IQ4_NL) or 256 (IQ4_XS).
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._numba import njit
from ..quants.iq_tables import KVALUES_IQ4NL
from ..quants.layouts import (
    IQ4_NL_BYTES,
    IQ4_NL_QS,
    IQ4_XS_BYTES,
    IQ4_XS_QS,
    IQ4_XS_SCALES_H,
    IQ4_XS_SCALES_L,
)
from .isimd import HAVE_AVX2
from .rowgroups import f16at, matvec_float, matvec_float_pf, prefetch_bytes_l1
from .simd import V8, _is_bytes, _ptr, f32x8, u16at, vfma, vload, vmul, vsplat

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_V8D = ir.VectorType(_I32, 8)
_V32B = ir.VectorType(_I8, 32)
_TABLE8 = [int(v) for v in KVALUES_IQ4NL]


@intrinsic
def vnl4(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """``kvalues_iq4nl`` at the 32 nibbles of the 16 bytes at ``idx`` (low nibbles: elements 0-15, high:
    16-31), as four ``F32x8`` (elements 0-7, 8-15, 16-23, 24-31)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    ret = types.UniTuple(f32x8, 4)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 16))
        q = builder.load(p, align=1)
        lo = builder.and_(q, ir.Constant(q.type, [15] * 16))
        hi = builder.lshr(q, ir.Constant(q.type, [4] * 16))
        nib = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        if HAVE_AVX2:  # vpshufb: a 16-entry byte table in each 128-bit lane
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V32B, [_V32B, _V32B]), "llvm.x86.avx2.pshuf.b"
            )
            vals = builder.call(fn, [ir.Constant(_V32B, _TABLE8 * 2), nib])
        else:
            tbl = ir.Constant(ir.VectorType(_I8, 16), _TABLE8)
            vals = ir.Constant(_V32B, None)
            for i in range(32):
                e = builder.extract_element(tbl, builder.extract_element(nib, ir.Constant(_I32, i)))
                vals = builder.insert_element(vals, e, ir.Constant(_I32, i))
        out = []
        for k in range(4):
            v8 = builder.shuffle_vector(vals, vals, ir.Constant(_V8D, list(range(8 * k, 8 * k + 8))))
            out.append(builder.sitofp(builder.sext(v8, _V8D), V8))
        return context.make_tuple(builder, ret, out)

    return ret(arr, idx), cg


@njit(inline="always")
def _nl(wr, q, x0, x1, x2, x3):
    """sum of kvalues[nibble] * x over a 16-byte run of quants at ``q`` (low nibbles: elements 0-15)."""
    u0, u1, u2, u3 = vnl4(wr, q)
    t = vmul(u0, x0)
    t = vfma(t, u1, x1)
    t = vfma(t, u2, x2)
    return vfma(t, u3, x3)


@njit(inline="always")
def _nl_row(acc, wr, o, xm, xe, f16):
    """One IQ4_NL block (``o``) of one row against ``xm[xe:xe + 32]``."""
    t = _nl(wr, o + IQ4_NL_QS, vload(xm, xe), vload(xm, xe + 8), vload(xm, xe + 16), vload(xm, xe + 24))
    return vfma(acc, vsplat(f16at(wr, o, f16)), t)


@njit(inline="always")
def _xs_row(acc, wr, o, xm, xb, f16):
    """One IQ4_XS super-block (``o``) of one row against ``xm[xb:xb + 256]``: per 32 weights the
    6-bit scale ``ls`` (low 4 bits from ``scales_l``, high 2 from ``scales_h``), ``d * (ls - 32)``."""
    d = f16at(wr, o, f16)
    sh = u16at(wr, o + IQ4_XS_SCALES_H)
    for ib in range(8):
        ls = ((wr[o + IQ4_XS_SCALES_L + ib // 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
        x = xb + 32 * ib
        t = _nl(
            wr, o + IQ4_XS_QS + 16 * ib, vload(xm, x), vload(xm, x + 8), vload(xm, x + 16), vload(xm, x + 24)
        )
        acc = vfma(acc, vsplat(d * np.float32(ls - 32)), t)
    return acc


# The kernels: the loop of ``rowgroups.matvec_float`` specialized for each row function.
@njit(parallel=True, cache=True, fastmath=True)
def mm_iq4_nl(w, x, out, f16):
    matvec_float(w, x, out, f16, _nl_row, IQ4_NL_BYTES, 32)


@njit(parallel=True, cache=True, fastmath=True)
def mm_iq4_xs(w, x, out, f16):
    matvec_float(w, x, out, f16, _xs_row, IQ4_XS_BYTES, 256)


@njit(parallel=True, cache=True, fastmath=True)
def mm_iq4_nl_l1(w, x, out, f16):
    matvec_float_pf(w, x, out, f16, _nl_row, IQ4_NL_BYTES, 32, prefetch_bytes_l1)


@njit(parallel=True, cache=True, fastmath=True)
def mm_iq4_xs_l1(w, x, out, f16):
    matvec_float_pf(w, x, out, f16, _xs_row, IQ4_XS_BYTES, 256, prefetch_bytes_l1)
