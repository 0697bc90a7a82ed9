"""k-quants: super-blocks of 256 elements with quantized sub-block scales (Q2_K .. Q6_K, Q8_K).

Block layouts (ggml-common.h):
- Q2_K  ``uint8 scales[16] (lo: scale, hi: min); uint8 qs[64] (2 bits); half d, dmin``
- Q3_K  ``uint8 hmask[32]; uint8 qs[64]; uint8 scales[12] (16 x 6 bits); half d``
- Q4_K  ``half d, dmin; uint8 scales[12] (8 scales + 8 mins, 6 bits); uint8 qs[128]``
- Q5_K  ``half d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]``
- Q6_K  ``uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d``
- Q8_K  ``float d; int8 qs[256]; int16 bsums[16]``
2-bit fields of a 128-element half: element ``32*k + l`` is bits ``2k..2k+1`` of ``qs[l]`` (k < 4).
"""

from __future__ import annotations

import numpy as np

from ..types import GGMLType
from . import _kquantize as _kq
from . import _rowk, _rowq
from .base import BlockQuant, f16, register

QK_K = 256
_U8 = np.uint8
_SH2 = np.array([0, 2, 4, 6], dtype=_U8).reshape((1, 1, 4, 1))


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """uint8[nb, 64] of 2-bit fields -> uint8[nb, 256] in element order."""
    nb = qs.shape[0]
    return ((qs.reshape((nb, 2, 1, 32)) >> _SH2) & _U8(3)).reshape((nb, QK_K))


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K (``get_scale_min_k4``), uint8[nb, 8] each."""
    s = scales.reshape((-1, 3, 4))
    a, b, c = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([a & _U8(63), (c & _U8(0x0F)) | ((a >> _U8(6)) << _U8(4))], axis=-1)
    mn = np.concatenate([b & _U8(63), (c >> _U8(4)) | ((b >> _U8(6)) << _U8(4))], axis=-1)
    return sc, mn


def q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """The 16 six-bit signed scales of Q3_K (already minus 32), int8[nb, 16]."""
    lo = np.concatenate([scales[:, :8] & _U8(0x0F), scales[:, :8] >> _U8(4)], axis=-1)  # j<8 lo, j>=8 hi
    hb = scales[:, 8:12]  # scales[8 + j%4] >> (2*(j//4))
    hi = (hb[:, None, :] >> np.array([0, 2, 4, 6], dtype=_U8).reshape((1, 4, 1))) & _U8(3)
    hi = hi.reshape((-1, 16))
    return ((lo | (hi << _U8(4))).astype(np.int8)) - np.int8(32)


@register(GGMLType.Q2_K)
class Q2_K(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        sc = blocks[:, :16]
        d, dmin = f16(blocks[:, 80:82]), f16(blocks[:, 82:84])
        dl = (d * (sc & _U8(0x0F)).astype(np.float32))[:, :, None]
        ml = (dmin * (sc >> _U8(4)).astype(np.float32))[:, :, None]
        q = _crumbs(blocks[:, 16:80]).reshape((nb, 16, 16)).astype(np.float32)
        return (dl * q - ml).reshape((nb, QK_K))

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _rowk.quantize_q2_k(x, qw)


@register(GGMLType.Q3_K)
class Q3_K(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        hmask, qs, scales = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
        d = f16(blocks[:, 108:110])
        dl = (d * q3_k_scales(scales).astype(np.float32))[:, :, None]
        ql = _crumbs(qs).astype(np.int8)
        # element 32*k + l (k < 8) takes bit k of hmask[l]; a clear bit subtracts 4
        hb = (hmask[:, None, :] >> np.arange(8, dtype=_U8).reshape((1, 8, 1))) & _U8(1)
        q = ql - ((hb.reshape((nb, QK_K)) ^ _U8(1)).astype(np.int8) << np.int8(2))
        return (dl * q.reshape((nb, 16, 16)).astype(np.float32)).reshape((nb, QK_K))

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _rowk.quantize_q3_k(x, qw)


def _q4k_like(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    d, dmin = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])
    sc, mn = scale_min_k4(blocks[:, 4:16])
    d1 = (d * sc.astype(np.float32))[:, :, None]
    m1 = (dmin * mn.astype(np.float32))[:, :, None]
    return (d1 * q.reshape((nb, 8, 32)).astype(np.float32) - m1).reshape((nb, QK_K))


def _q4k_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8[nb, 128] -> uint8[nb, 256]: per 32 bytes, 32 low nibbles then 32 high nibbles."""
    nb = qs.shape[0]
    q = qs.reshape((nb, 4, 1, 32)) >> np.array([0, 4], dtype=_U8).reshape((1, 1, 2, 1))
    return (q & _U8(0x0F)).reshape((nb, QK_K))


@register(GGMLType.Q4_K)
class Q4_K(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        return _q4k_like(blocks, _q4k_nibbles(blocks[:, 16:144]))

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _rowk.quantize_q4_k(x, qw)


@register(GGMLType.Q5_K)
class Q5_K(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        ql = _q4k_nibbles(blocks[:, 48:176])
        # element 32*k + l takes bit k of qh[l]
        qh = (blocks[:, None, 16:48] >> np.arange(8, dtype=_U8).reshape((1, 8, 1))) & _U8(1)
        return _q4k_like(blocks, ql | (qh.reshape((nb, QK_K)) << _U8(4)))

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _rowk.quantize_q5_k(x, qw)


@register(GGMLType.Q6_K)
class Q6_K(BlockQuant):
    uses_imatrix = True

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        nb = blocks.shape[0]
        ql, qh = blocks[:, :128], blocks[:, 128:192]
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
        d = f16(blocks[:, 208:210])
        # per 128-element half h: elements 32*k + l (k < 4) take nibble (k >= 2) of ql[64h + 32*(k&1) + l]
        # and bits 2k..2k+1 of qh[32h + l]
        lo = ql.reshape((nb, 2, 1, 64)) >> np.array([0, 4], dtype=_U8).reshape((1, 1, 2, 1))
        lo = (lo & _U8(0x0F)).reshape((nb, 2, 4, 32))
        hi = (qh.reshape((nb, 2, 1, 32)) >> _SH2) & _U8(3)
        q = (lo | (hi << _U8(4))).astype(np.int8) - np.int8(32)
        dl = (d * sc)[:, :, None]
        return (dl * q.reshape((nb, 16, 16)).astype(np.float32)).reshape((nb, QK_K))

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _rowq.quantize_q6_k(x, qw)


@register(GGMLType.Q8_K)
class Q8_K(BlockQuant):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = np.ascontiguousarray(blocks[:, :4]).view("<f4").astype(np.float32)
        return d * blocks[:, 4:260].view(np.int8).astype(np.float32)

    @classmethod
    def quantize_blocks(cls, x, qw=None, sigma2=None):
        return _kq.quantize_q8_k(x)
