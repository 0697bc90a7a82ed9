"""Mat-vec kernels for the low-bit k-quants (Q2_K, Q3_K): 8-bit activations and integer dot products,
as ``kquant_kernels`` does for Q4_K..Q6_K (and llama.cpp's ``ggml_vec_dot_q2_K_q8_K`` /
``ggml_vec_dot_q3_K_q8_K``, whose ``vec_dot_type`` is ``Q8_K``).

Both types hold a super-block of 256 weights as two halves of 128; each half is four runs of 32 quants
taken from the same 32 bytes of ``qs`` at bit shifts 0, 2, 4, 6, one scale per 16 weights:
- Q2_K: ``w = d * (sc & 15) * q - dmin * (sc >> 4)``, q = 0..3: the integer sum of ``q * x8`` times the
  scales, and the mins (high nibbles) times the per-16 byte sums of the activations;
- Q3_K: ``w = d * (sc - 32) * (q - 4)`` with q = 0..7, its third bit from ``hmask`` (bit ``4 * half + run``
  of the byte at the element's position in the run): the -4 goes in as 4 times the signed scales against
  the per-16 byte sums, the same way ``kquant_kernels`` handles Q6_K's -32.

Result: ``out = W @ dequantize(quantize(x, Q8_K))`` up to float rounding of the super-block sums. Call as
``MATVEC``: ``kern(w, x, out, f16)``; K a multiple of 256.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import njit
from ..quants.layouts import (
    Q2_K_BYTES,
    Q2_K_D,
    Q2_K_DMIN,
    Q2_K_QS,
    Q2_K_SCALES,
    Q3_K_BYTES,
    Q3_K_D,
    Q3_K_HMASK,
    Q3_K_QS,
    Q3_K_SCALES,
)
from .isimd import (
    B32,
    I32x8,
    _cb,
    _int_to,
    _load32,
    _splat,
    bload,
    iadd,
    ilane,
    iload,
    imadd2,
    imul,
    itof,
    izero,
)
from .kquant_kernels import matvec_k, matvec_k_pf
from .rowgroups import f16at, prefetch_bytes_l1
from .simd import _is_bytes, _ptr, vfma, vsplat

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_V8D = ir.VectorType(_I32, 8)


def _shifted(context, builder, sig, args, i_arr, i_idx, i_shift, mask):  # type: ignore[no-untyped-def]
    """(the 32 bytes at args[i_idx] >> args[i_shift]) & mask."""
    q = _load32(context, builder, sig.args[i_arr], args[i_arr], args[i_idx], sig.args[i_idx])
    sh = _splat(builder, q.type, _int_to(builder, args[i_shift], _I8, False))
    return builder.and_(builder.lshr(q, sh), _cb(mask))


@intrinsic
def bq2(typingctx, arr, idx, shift):  # type: ignore[no-untyped-def]
    """Q2_K: bits ``shift``, ``shift + 1`` of the 32 bytes at ``idx``: 0..3."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer) and isinstance(shift, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return _shifted(context, builder, sig, args, 0, 1, 2, 3)

    return B32(arr, idx, shift), cg


@intrinsic
def bq3(typingctx, arr, idx, shift, hidx, hbit):  # type: ignore[no-untyped-def]
    """Q3_K: bits ``shift``, ``shift + 1`` of the 32 bytes at ``idx`` plus 4 times bit ``hbit`` of the
    32 bytes at ``hidx`` (``hmask``): 0..7."""
    ok = _is_bytes(arr) and all(isinstance(a, types.Integer) for a in (idx, shift, hidx, hbit))
    if not ok:
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        lo = _shifted(context, builder, sig, args, 0, 1, 2, 3)
        h = _shifted(context, builder, sig, args, 0, 3, 4, 1)
        return builder.or_(lo, builder.shl(h, _cb(2)))

    return B32(arr, idx, shift, hidx, hbit), cg


@intrinsic
def inib8(typingctx, arr, idx, hi):  # type: ignore[no-untyped-def]
    """The low (``hi`` False) or high nibbles of the 8 bytes at ``idx`` as int32 lanes (Q2_K's mins)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 8))
        v = builder.zext(builder.load(p, align=1), _V8D)
        h = context.cast(builder, args[2], sig.args[2], types.boolean)
        return builder.select(
            h, builder.lshr(v, ir.Constant(_V8D, [4] * 8)), builder.and_(v, ir.Constant(_V8D, [15] * 8))
        )

    return I32x8(arr, idx, hi), cg


@intrinsic
def iq3scales(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 16 signed scales (``raw - 32``: -32..31) of a Q3_K block from its 12 scale bytes at ``idx``, as
    two ``I32x8`` (scales 0-7, 8-15): llama.cpp's ``kmask1``/``kmask2`` unpacking, all lanes at once.
    Scale i (i < 8) is the low nibble of byte i, scale 8 + i the high nibble; bits 4-5 come from byte
    8 + i % 4 at shift 2 * (i // 4) (+ 4 for the second eight)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None
    ret = types.UniTuple(I32x8, 2)

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], ir.VectorType(_I8, 12))
        raw = builder.zext(builder.load(p, align=1), ir.VectorType(_I32, 12))

        def c(v):  # type: ignore[no-untyped-def]
            return ir.Constant(_V8D, v if isinstance(v, list) else [v] * 8)

        lo = builder.shuffle_vector(raw, raw, ir.Constant(_V8D, list(range(8))))
        hb = builder.shuffle_vector(raw, raw, ir.Constant(_V8D, [8, 9, 10, 11, 8, 9, 10, 11]))
        sh = [0, 0, 0, 0, 2, 2, 2, 2]
        top0 = builder.shl(builder.and_(builder.lshr(hb, c(sh)), c(3)), c(4))
        top1 = builder.shl(builder.and_(builder.lshr(hb, c([s + 4 for s in sh])), c(3)), c(4))
        s0 = builder.sub(builder.or_(builder.and_(lo, c(15)), top0), c(32))
        s1 = builder.sub(builder.or_(builder.lshr(lo, c(4)), top1), c(32))
        return context.make_tuple(builder, ret, [s0, s1])

    return ret(arr, idx), cg


@njit(inline="always")
def _q2k_row(acc, wr, o, xq, x0, d8, bsv, bs16, f16):
    """One Q2_K block (``o``) of one row against the activation bytes from ``x0``."""
    sc = o + Q2_K_SCALES
    s = izero()
    for n in range(2):
        q = o + Q2_K_QS + 32 * n
        xb = x0 + 128 * n
        for j in range(4):
            g = sc + 8 * n + 2 * j
            s = imadd2(s, bq2(wr, q, 2 * j), bload(xq, xb + 32 * j), wr[g] & 15, wr[g + 1] & 15)
    b16 = x0 // 16
    mins = iadd(
        imul(inib8(wr, sc, True), iload(bs16, b16)), imul(inib8(wr, sc + 8, True), iload(bs16, b16 + 8))
    )
    acc = vfma(acc, vsplat(f16at(wr, o + Q2_K_D, f16) * d8), itof(s))
    return vfma(acc, vsplat(-f16at(wr, o + Q2_K_DMIN, f16) * d8), itof(mins))


@njit(inline="always")
def _q3_half(s, wr, q, hm, hb0, xq, xb, sv):
    """The four runs of 32 of one Q3_K half (quants at ``q``, hmask bits ``hb0``..``hb0 + 3``)."""
    for j in range(4):
        u = bq3(wr, q, 2 * j, hm, hb0 + j)
        s = imadd2(s, u, bload(xq, xb + 32 * j), ilane(sv, 2 * j), ilane(sv, 2 * j + 1))
    return s


@njit(inline="always")
def _q3k_row(acc, wr, o, xq, x0, d8, bsv, bs16, f16):
    """One Q3_K block of one row: quants 0..7 times the signed scales, then -4 times the scales against
    the per-16 byte sums ``bs16``."""
    s0, s1 = iq3scales(wr, o + Q3_K_SCALES)
    hm = o + Q3_K_HMASK
    s = _q3_half(izero(), wr, o + Q3_K_QS, hm, 0, xq, x0, s0)
    s = _q3_half(s, wr, o + Q3_K_QS + 32, hm, 4, xq, x0 + 128, s1)
    b16 = x0 // 16
    off = iadd(imul(s0, iload(bs16, b16)), imul(s1, iload(bs16, b16 + 8)))
    d = f16at(wr, o + Q3_K_D, f16) * d8
    acc = vfma(acc, vsplat(d), itof(s))
    return vfma(acc, vsplat(np.float32(-4.0) * d), itof(off))


# The loop is kquant_kernels' (``matvec_k``), specialized for each row function.
@njit(parallel=True, cache=True)
def mm_q2_k(w, x, out, f16):
    matvec_k(w, x, out, f16, _q2k_row, Q2_K_BYTES)


@njit(parallel=True, cache=True)
def mm_q3_k(w, x, out, f16):
    matvec_k(w, x, out, f16, _q3k_row, Q3_K_BYTES)


@njit(parallel=True, cache=True)
def mm_q2_k_l1(w, x, out, f16):
    matvec_k_pf(w, x, out, f16, _q2k_row, Q2_K_BYTES, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def mm_q3_k_l1(w, x, out, f16):
    matvec_k_pf(w, x, out, f16, _q3k_row, Q3_K_BYTES, prefetch_bytes_l1)
