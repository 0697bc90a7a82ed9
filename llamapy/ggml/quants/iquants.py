"""i-quants (lattice codebooks with importance-aware quantization), ternary TQ1_0/TQ2_0 and MXFP4.

Block layouts (ggml-common.h; 256 elements unless noted, ``ib`` = 32-element group):
- IQ2_XXS ``half d; uint16 qs[32]``: per ib two uint32: 4 grid bytes; 4 x 7-bit sign indices, 4-bit scale
- IQ2_XS  ``half d; uint16 qs[32] (9-bit grid | 7-bit signs); uint8 scales[8] (two 4-bit)``
- IQ2_S   ``half d; uint8 qs[32] grid lo; uint8 signs[32]; uint8 qh[8] (grid bits 8-9); uint8 scales[8]``
- IQ3_XXS ``half d; uint8 qs[64] grid; uint32 scales_and_signs[8]``
- IQ3_S   ``half d; uint8 qs[64]; uint8 qh[8] (grid bit 8); uint8 signs[32]; uint8 scales[4]``
- IQ1_S   ``half d; uint8 qs[32]; uint16 qh[8] (3 grid bits x 4, 3-bit scale, delta sign)``
- IQ1_M   ``uint8 qs[32]; uint8 qh[16]; uint16 scales[4] (12 x 3-bit scales + the f16 d in top nibbles)``
- IQ4_NL  (32 elements) ``half d; uint8 qs[16]``: x = d * kvalues_iq4nl[nibble]
- IQ4_XS  ``half d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]``
- TQ1_0   ``uint8 qs[48] (5 trits per byte); uint8 qh[4] (4 trits); half d``
- TQ2_0   ``uint8 qs[64] (2 bits per element); half d``
- MXFP4   (32 elements) ``uint8 e (E8M0); uint8 qs[16]``: x = kvalues_fp4[nibble] * 2**(e-128)

Dequantizers do llama.cpp's float32 operations in its order (``dequantize_row_*``). Quantizers:
``_iquantize`` (IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4), ``_iq3`` (IQ3_XXS, IQ3_S), ``_iq2`` (IQ2_XXS,
IQ2_XS, IQ2_S), ``_iq1`` (IQ1_S, IQ1_M).
"""

from __future__ import annotations

import numpy as np

from ..types import GGMLType
from . import iq_tables as T
from .base import BlockQuant, f16, nibbles, register

QK_K = 256
F = np.float32
_U8 = np.uint8


def _grid(table: np.ndarray, signed: bool = False) -> np.ndarray:
    """A grid of packed uint64/uint32 entries -> one row of float32 byte values per entry."""
    b = table.astype(table.dtype.newbyteorder("<")).view(np.int8 if signed else np.uint8)
    return b.reshape((table.shape[0], -1)).astype(F)


GRID_IQ2XXS = _grid(T.IQ2XXS_GRID)
GRID_IQ2XS = _grid(T.IQ2XS_GRID)
GRID_IQ2S = _grid(T.IQ2S_GRID)
GRID_IQ3XXS = _grid(T.IQ3XXS_GRID)
GRID_IQ3S = _grid(T.IQ3S_GRID)
GRID_IQ1S = _grid(T.IQ1S_GRID, signed=True)
# ksigns_iq2xs expanded to +-1.0 per bit
SIGNS8 = np.where((T.KSIGNS_IQ2XS[:, None] >> np.arange(8, dtype=_U8)) & 1, F(-1), F(1)).astype(F)
KVALUES_IQ4NL = T.KVALUES_IQ4NL.astype(F)
KVALUES_FP4 = T.KVALUES_FP4.astype(F)
IQ1S_DELTA = F(0.125)


def _u16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u2").astype(np.uint32)


def _u32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u4").astype(np.uint32)


def _bit_signs(b: np.ndarray) -> np.ndarray:
    """uint8[..., m] -> float32[..., m, 8]: -1 where bit j is set, else +1."""
    return np.where((b[..., None] >> np.arange(8, dtype=_U8)) & _U8(1), F(-1), F(1)).astype(F)


def _half_scales(scales: np.ndarray, d: np.ndarray, mul: float) -> np.ndarray:
    """IQ2_XS/IQ2_S: ``d * (0.5f + nibble) * 0.25f`` for each 16 elements -> float32[nb, 16]."""
    s = np.stack([scales & _U8(0x0F), scales >> _U8(4)], axis=-1).reshape((scales.shape[0], -1))
    return (d * (F(0.5) + s.astype(F)) * F(mul)).astype(F)


@register(GGMLType.IQ2_XXS)
class IQ2_XXS(BlockQuant):
    uses_imatrix = True
    requires_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq2 import quantize_iq2_xxs

        return quantize_iq2_xxs(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        aux = _u32(blocks[:, 2:66]).reshape((nb, 8, 2))
        db = (d * (F(0.5) + (aux[:, :, 1] >> 28).astype(F)) * F(0.25)).astype(F)  # [nb, 8]
        gidx = blocks[:, 2:66].reshape((nb, 8, 8))[:, :, :4]  # [nb, 8, 4]
        sidx = (aux[:, :, 1:2] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)
        y = db[:, :, None, None] * GRID_IQ2XXS[gidx] * SIGNS8[sidx]
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ2_XS)
class IQ2_XS(BlockQuant):
    uses_imatrix = True
    requires_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq2 import quantize_iq2_xs

        return quantize_iq2_xs(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        qs = _u16(blocks[:, 2:66]).reshape((nb, 16, 2))  # [nb, 16 groups of 16, 2 x 8]
        db = _half_scales(blocks[:, 66:74], d, 0.25)
        y = db[:, :, None, None] * GRID_IQ2XS[qs & 511] * SIGNS8[qs >> 9]
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ2_S)
class IQ2_S(BlockQuant):
    uses_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq2 import quantize_iq2_s

        return quantize_iq2_s(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        qs = blocks[:, 2:34].astype(np.uint32)
        signs = blocks[:, 34:66]
        qh = blocks[:, 66:74].astype(np.uint32)
        # grid index of qs[4*ib + l] takes bits 2l..2l+1 of qh[ib] as bits 8..9
        hi = (qh[:, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint32)) & np.uint32(3)
        idx = qs | (hi.reshape((nb, 32)) << np.uint32(8))
        db = _half_scales(blocks[:, 74:82], d, 0.25)
        y = db.reshape((nb, 16, 1, 1)) * GRID_IQ2S[idx].reshape((nb, 16, 2, 8))
        y = y * _bit_signs(signs).reshape((nb, 16, 2, 8))
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ3_XXS)
class IQ3_XXS(BlockQuant):
    uses_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq3 import quantize_iq3_xxs

        return quantize_iq3_xxs(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        qs = blocks[:, 2:66]
        aux = _u32(blocks[:, 66:98])  # [nb, 8]
        db = (d * (F(0.5) + (aux >> 28).astype(F)) * F(0.5)).astype(F)
        sidx = (aux[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)  # [nb, 8, 4]
        grid = GRID_IQ3XXS[qs].reshape((nb, 8, 4, 8))  # two 4-value grid entries per 8 elements
        y = db[:, :, None, None] * grid * SIGNS8[sidx]
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ3_S)
class IQ3_S(BlockQuant):
    uses_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq3 import quantize_iq3_s

        return quantize_iq3_s(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        qs = blocks[:, 2:66].astype(np.uint32).reshape((nb, 8, 8))
        qh = blocks[:, 66:74].astype(np.uint32)
        signs = blocks[:, 74:106]
        scales = blocks[:, 106:110]
        sc = np.stack([scales & _U8(0x0F), scales >> _U8(4)], axis=-1).reshape((nb, 8)).astype(np.int32)
        db = (d * (1 + 2 * sc).astype(F)).astype(F)  # [nb, 8]
        hi = (qh[:, :, None] >> np.arange(8, dtype=np.uint32)) & np.uint32(1)
        idx = qs | (hi << np.uint32(8))
        grid = GRID_IQ3S[idx].reshape((nb, 8, 4, 8))
        y = db[:, :, None, None] * grid * _bit_signs(signs).reshape((nb, 8, 4, 8))
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ1_S)
class IQ1_S(BlockQuant):
    uses_imatrix = True
    requires_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq1 import quantize_iq1_s

        return quantize_iq1_s(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        qs = blocks[:, 2:34].astype(np.uint32).reshape((nb, 8, 4))
        qh = _u16(blocks[:, 34:50])  # [nb, 8]
        dl = (d * (2 * ((qh >> 12) & 7) + 1).astype(F)).astype(F)
        delta = np.where(qh & 0x8000, -IQ1S_DELTA, IQ1S_DELTA).astype(F)
        idx = qs | (((qh[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint32)) & 7) << 8)
        y = dl[:, :, None, None] * (GRID_IQ1S[idx] + delta[:, :, None, None])
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ1_M)
class IQ1_M(BlockQuant):
    uses_imatrix = True

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iq1 import quantize_iq1_m

        return quantize_iq1_m(x, qw)

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        qs = blocks[:, :32].astype(np.uint32).reshape((nb, 8, 4))
        qh = blocks[:, 32:48].astype(np.uint32).reshape((nb, 8, 2))
        sc = _u16(blocks[:, 48:56])  # [nb, 4]
        dbits = (
            (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
        )
        d = dbits.astype("<u2").view("<f2").astype(F)[:, None]
        # two 3-bit scales per 32-element group: sc[ib//2] >> (6*(ib%2)) and >> (6*(ib%2)+3)
        s = (sc[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint32)) & 7  # [nb, 4, 4] -> [nb, 8, 2]
        dl = (d[:, :, None] * (2 * s.reshape((nb, 8, 2)) + 1).astype(F)).astype(F)
        # qs[l] takes 3 bits of qh[l//2] (low nibble for even l, high for odd) as bits 8..10
        nib = (qh[:, :, :, None] >> np.array([0, 4], dtype=np.uint32)).reshape((nb, 8, 4))
        idx = qs | ((nib & 7) << 8)
        delta = np.where(nib & 8, -IQ1S_DELTA, IQ1S_DELTA).astype(F)
        y = dl.reshape((nb, 8, 2, 1, 1)) * (GRID_IQ1S[idx] + delta[..., None]).reshape((nb, 8, 2, 2, 8))
        return y.reshape((nb, QK_K))


@register(GGMLType.IQ4_NL)
class IQ4_NL(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = f16(blocks[:, :2])
        return d * KVALUES_IQ4NL[nibbles(blocks[:, 2:18])]

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._rowq import quantize_iq4_nl

        return quantize_iq4_nl(x, qw, sigma2)


@register(GGMLType.IQ4_XS)
class IQ4_XS(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, :2])
        sh = _u16(blocks[:, 2:4])  # [nb, 1]
        sl = blocks[:, 4:8]
        lo = np.stack([sl & _U8(0x0F), sl >> _U8(4)], axis=-1).reshape((nb, 8)).astype(np.int32)
        hi = ((sh >> (2 * np.arange(8, dtype=np.uint32))) & 3).astype(np.int32)
        dl = (d * ((lo | (hi << 4)) - 32).astype(F)).astype(F)  # [nb, 8]
        q = nibbles(blocks[:, 8:136].reshape((nb, 8, 16)))  # [nb, 8, 32]
        return (dl[:, :, None] * KVALUES_IQ4NL[q]).reshape((nb, QK_K))

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._rowq import quantize_iq4_xs

        return quantize_iq4_xs(x, qw, sigma2)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=_U8)


def _trits(b: np.ndarray, n: int) -> np.ndarray:
    """TQ1_0's base-3 digits: uint8[..., m] -> int[..., n, m] in -1..1 (``((uint8)(q*3^k) * 3) >> 8``)."""
    q = (b[..., None, :] * _POW3[:n, None]).astype(_U8)  # wraps mod 256 like the C code
    return ((q.astype(np.uint16) * 3) >> 8).astype(np.int16) - 1


@register(GGMLType.TQ1_0)
class TQ1_0(BlockQuant):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, 52:54])
        a = _trits(blocks[:, :32], 5).reshape((nb, 160))
        b = _trits(blocks[:, 32:48], 5).reshape((nb, 80))
        c = _trits(blocks[:, 48:52], 4).reshape((nb, 16))
        return np.concatenate([a, b, c], axis=-1).astype(F) * d

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iquantize import quantize_tq1_0

        return quantize_tq1_0(x)


@register(GGMLType.TQ2_0)
class TQ2_0(BlockQuant):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        d = f16(blocks[:, 64:66])
        q = (blocks[:, :64].reshape((nb, 2, 1, 32)) >> np.array([0, 2, 4, 6], dtype=_U8)[:, None]) & _U8(3)
        return (q.reshape((nb, QK_K)).astype(np.int8) - np.int8(1)).astype(F) * d

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iquantize import quantize_tq2_0

        return quantize_tq2_0(x)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """ggml's ``GGML_E8M0_TO_FP32_HALF``: 2**(e - 128) as float32 (subnormal for e < 2)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F)


@register(GGMLType.MXFP4)
class MXFP4(BlockQuant):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = e8m0_to_fp32_half(blocks[:, :1])
        return KVALUES_FP4[nibbles(blocks[:, 1:17])] * d

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        from ._iquantize import quantize_mxfp4

        return quantize_mxfp4(x)
