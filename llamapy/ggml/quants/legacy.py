"""The original ggml block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32 elements per block).

Block layouts (ggml-common.h), little-endian:
- Q4_0  ``half d; uint8 qs[16]``                  x = d * (q - 8)
- Q4_1  ``half d, m; uint8 qs[16]``               x = d * q + m
- Q5_0  ``half d; uint8 qh[4]; uint8 qs[16]``     x = d * (q - 16), bit 4 of element j is bit j of qh
- Q5_1  ``half d, m; uint8 qh[4]; uint8 qs[16]``  x = d * q + m
- Q8_0  ``half d; int8 qs[32]``                   x = d * q
- Q8_1  ``half d, s; int8 qs[32]``                x = d * q  (s = d * sum(q), used by dot products)
Nibble packing: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.

Quantizers follow llama.cpp's ``quantize_row_*_ref`` (no importance weights) and
``quantize_row_*_impl`` (with importance weights) operation by operation, so bytes match.
"""

from __future__ import annotations

import numpy as np

from ..types import GGMLType
from . import _rowq
from ._search import make_qkx3_quants, make_qx_quants
from .base import BlockQuant, f16, nibbles, register, roundf, to_f16_bytes

_U8 = np.uint8


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8[nb, 32] of values < 16 -> uint8[nb, 16]."""
    return (q[:, :16] & _U8(0x0F)) | (q[:, 16:] << _U8(4))


def _pack_qh(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 values -> the 4 bytes of a little-endian uint32."""
    return np.packbits((q >> _U8(4)) & _U8(1), axis=-1, bitorder="little")


def _unpack_q5(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    hi = np.unpackbits(qh, axis=-1, bitorder="little")  # [nb, 32], element j <- bit j
    return nibbles(qs) | (hi << _U8(4))


def _inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)


def _imatrix_weights(x: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """``qw[j] * sqrtf(sigma2 + x[j]*x[j])`` of the legacy ``_impl`` quantizers."""
    return (qw * np.sqrt(sigma2 + x * x)).astype(np.float32)


@register(GGMLType.Q4_0)
class Q4_0(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = f16(blocks[:, :2])
        q = nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
        return d * q.astype(np.float32)

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        if qw is not None:
            w = _imatrix_weights(x, qw, sigma2)
            d, L = make_qx_quants(x, 8, w, rmse_type=1)
            return np.concatenate([to_f16_bytes(d), _pack_nibbles(L.astype(_U8))], axis=-1)
        return _rowq.quantize_q4_0(x)


@register(GGMLType.Q4_1)
class Q4_1(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d, m = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
        return d * nibbles(blocks[:, 4:]).astype(np.float32) + m

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        if qw is not None:
            w = _imatrix_weights(x, qw, sigma2)
            d, mn, L = make_qkx3_quants(x, 15, w, rmin=-0.9, rdelta=0.05, nstep=36, use_mad=False)
            return np.concatenate([to_f16_bytes(d), to_f16_bytes(-mn), _pack_nibbles(L)], axis=-1)
        return _rowq.quantize_q4_1(x)


@register(GGMLType.Q5_0)
class Q5_0(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = f16(blocks[:, :2])
        q = _unpack_q5(blocks[:, 2:6], blocks[:, 6:]).astype(np.int8) - np.int8(16)
        return d * q.astype(np.float32)

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        if qw is None:
            return _rowq.quantize_q5_0(x)
        w = _imatrix_weights(x, qw, sigma2)
        d, L = make_qx_quants(x, 16, w, rmse_type=1)
        q = L.astype(_U8)
        return np.concatenate([to_f16_bytes(d), _pack_qh(q), _pack_nibbles(q)], axis=-1)


@register(GGMLType.Q5_1)
class Q5_1(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d, m = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
        return d * _unpack_q5(blocks[:, 4:8], blocks[:, 8:]).astype(np.float32) + m

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        if qw is None:  # (uint8_t)(v + 0.5f): no clamp in llama.cpp; values stay <= 31 up to rounding
            return _rowq.quantize_q5_1(x)
        w = _imatrix_weights(x, qw, sigma2)
        d, mn, q = make_qkx3_quants(x, 31, w, rmin=-0.9, rdelta=0.05, nstep=36, use_mad=False)
        m = -mn
        return np.concatenate([to_f16_bytes(d), to_f16_bytes(m), _pack_qh(q), _pack_nibbles(q)], axis=-1)


def _q8_scale(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    amax = np.abs(x).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    return d, roundf(x * _inv(d)).astype(np.int8)


@register(GGMLType.Q8_0)
class Q8_0(BlockQuant):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = f16(blocks[:, :2])
        return d * blocks[:, 2:].view(np.int8).astype(np.float32)

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _rowq.quantize_q8_0(x)


@register(GGMLType.Q8_1)
class Q8_1(BlockQuant):
    """36 bytes as in llama.cpp's ggml-common.h (gguf-py's table says 40)."""

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = f16(blocks[:, :2])
        return d * blocks[:, 4:].view(np.int8).astype(np.float32)

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        d, q = _q8_scale(x)
        s = q.astype(np.int32).sum(axis=-1, keepdims=True).astype(np.float32) * d
        return np.concatenate([to_f16_bytes(d), to_f16_bytes(s), q.view(_U8)], axis=-1)


# ---- plain (one element per "block") types -----------------------------------------------------------


class PlainType(BlockQuant):
    """F32, F16, F64 and the integer types: one element per block, stored as the NumPy dtype."""

    dtype: np.dtype

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(blocks).view(cls.dtype).astype(np.float32)


def _plain(t: GGMLType, dtype: str, quantizable: bool) -> type[PlainType]:
    ns: dict = {"dtype": np.dtype(dtype)}
    if quantizable:

        def quantize_blocks(cls, x, qw=None, sigma2=None):
            return np.ascontiguousarray(x.astype(cls.dtype)).view(_U8)

        ns["quantize_blocks"] = classmethod(quantize_blocks)
    return register(t)(type(t.name, (PlainType,), ns))


F32 = _plain(GGMLType.F32, "<f4", True)
F16 = _plain(GGMLType.F16, "<f2", True)
F64 = _plain(GGMLType.F64, "<f8", True)
I8 = _plain(GGMLType.I8, "i1", False)
I16 = _plain(GGMLType.I16, "<i2", False)
I32 = _plain(GGMLType.I32, "<i4", False)
I64 = _plain(GGMLType.I64, "<i8", False)


@register(GGMLType.BF16)
class BF16(BlockQuant):
    """bfloat16: the high half of a float32 (ggml_compute_fp32_to_bf16 rounds to nearest even)."""

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        u = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32) << np.uint32(16)
        return u.view(np.float32)

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        r = (u.astype(np.uint64) + (np.uint64(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint64(
            16
        )
        r = np.where(nan, (u >> np.uint32(16)) | np.uint32(64), r)
        return np.ascontiguousarray(r.astype("<u2")).view(_U8)
