"""Mat-vec kernels for half-precision weights, F16 and BF16: the weight stays in its 16-bit form and each
group of eight elements is widened to floats in registers (F16: F16C ``vcvtph2ps``; BF16: a 16-bit
shift), never a float copy of the matrix.

Before these, an F16 or BF16 weight went through the dequantized-tile path (``matmul_steps``: rows
converted to float32 by NumPy, then sgemm) for every token: SmolLM2-135M F16 decoded at ~2.5 tokens per
CPU-second, 20x slower than llama.cpp.

The loop is ``rowgroups.matvec_float`` (four weight rows per pass, prefetch, ``prange`` over row groups,
``F32x8`` accumulators), with a 32-element "block" of 64 bytes. Float activations, fused multiply-adds:
the product is as exact as float32 allows (no activation rounding).

Call as ``MATVEC``: ``kern(w, x, out, f16)`` with ``w`` the weight as ``float16`` / ``uint16`` ``[N, K]``
(C-contiguous; viewed as bytes here). K a multiple of 32 runs the kernel; another K (rare: no model
llamapy runs has one) the NumPy product.
"""

from __future__ import annotations

from ... import _numba  # noqa: F401  (first: it sets NUMBA_CACHE_DIR before Numba is imported)

# isort: split
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..._numba import njit
from .rowgroups import matvec_float, matvec_float_pf, prefetch_bytes_l1
from .simd import V8, _is_bytes, _ptr, f32x8, vfma, vload

_I16x8 = ir.VectorType(ir.IntType(16), 8)
_I32x8 = ir.VectorType(ir.IntType(32), 8)
_H8 = ir.VectorType(ir.HalfType(), 8)

#: elements and bytes of one pass of the row loop (four ``F32x8``)
BLOCK = 32
BLOCK_BYTES = 64


@intrinsic
def vh8b(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 8 half floats at byte ``idx`` of a byte array, as floats (F16C ``vcvtph2ps``)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _H8)
        return builder.fpext(builder.load(p, align=1), V8)

    return f32x8(arr, idx), cg


@intrinsic
def vbf8b(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """The 8 bfloat16 at byte ``idx`` of a byte array, as floats (the bits shifted into a float's top half)."""
    if not (_is_bytes(arr) and isinstance(idx, types.Integer)):
        return None

    def cg(context, builder, sig, args):  # type: ignore[no-untyped-def]
        p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I16x8)
        wide = builder.zext(builder.load(p, align=1), _I32x8)
        return builder.bitcast(builder.shl(wide, ir.Constant(_I32x8, [16] * 8)), V8)

    return f32x8(arr, idx), cg


@njit(inline="always")
def _row_f16(acc, wr, o, xm, xe, f16):  # type: ignore[no-untyped-def]
    acc = vfma(acc, vh8b(wr, o), vload(xm, xe))
    acc = vfma(acc, vh8b(wr, o + 16), vload(xm, xe + 8))
    acc = vfma(acc, vh8b(wr, o + 32), vload(xm, xe + 16))
    return vfma(acc, vh8b(wr, o + 48), vload(xm, xe + 24))


@njit(inline="always")
def _row_bf16(acc, wr, o, xm, xe, f16):  # type: ignore[no-untyped-def]
    acc = vfma(acc, vbf8b(wr, o), vload(xm, xe))
    acc = vfma(acc, vbf8b(wr, o + 16), vload(xm, xe + 8))
    acc = vfma(acc, vbf8b(wr, o + 32), vload(xm, xe + 16))
    return vfma(acc, vbf8b(wr, o + 48), vload(xm, xe + 24))


@njit(parallel=True, cache=True)
def _mm_f16(w, x, out, f16):  # type: ignore[no-untyped-def]
    matvec_float(w, x, out, f16, _row_f16, BLOCK_BYTES, BLOCK)


@njit(parallel=True, cache=True)
def _mm_bf16(w, x, out, f16):  # type: ignore[no-untyped-def]
    matvec_float(w, x, out, f16, _row_bf16, BLOCK_BYTES, BLOCK)


@njit(parallel=True, cache=True)
def _mm_f16_l1(w, x, out, f16):  # type: ignore[no-untyped-def]
    matvec_float_pf(w, x, out, f16, _row_f16, BLOCK_BYTES, BLOCK, prefetch_bytes_l1)


@njit(parallel=True, cache=True)
def _mm_bf16_l1(w, x, out, f16):  # type: ignore[no-untyped-def]
    matvec_float_pf(w, x, out, f16, _row_bf16, BLOCK_BYTES, BLOCK, prefetch_bytes_l1)


def _to_f32(w: np.ndarray, bf16: bool) -> np.ndarray:
    if bf16:
        return (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return w.view(np.float16).astype(np.float32)


def _entry(kernel: Any, bf16: bool) -> Any:
    """The ``MATVEC`` entry: the 16-bit weight viewed as bytes for ``kernel`` (NumPy for K % 32 != 0)."""

    def kern(w: np.ndarray, x: np.ndarray, out: np.ndarray, f16: np.ndarray) -> None:
        if w.shape[-1] % BLOCK:
            np.matmul(x, _to_f32(w, bf16).T, out=out)
            return
        kernel(w.view(np.uint8), x, out, f16)

    kern._cache = kernel._cache  # type: ignore[attr-defined]  (backend._announce: is it compiled yet?)
    kern.__name__ = kern.__qualname__ = kernel.__name__.lstrip("_")
    kern.__doc__ = f"``MATVEC`` entry for {'BF16' if bf16 else 'F16'} weights (``{kernel.__name__}``)."
    return kern


mm_f16 = _entry(_mm_f16, bf16=False)
mm_bf16 = _entry(_mm_bf16, bf16=True)
mm_f16_l1 = _entry(_mm_f16_l1, bf16=False)
mm_bf16_l1 = _entry(_mm_bf16_l1, bf16=True)
