"""The registry of block types and the base class every per-type codec derives from.

A codec works on whole blocks: ``dequantize_blocks(uint8[nb, type_size]) -> float32[nb, block_size]``
and ``quantize_blocks(float32[nb, block_size], weights float32[nb, block_size] | None) -> uint8[nb,
type_size]``. The public functions in ``llamapy.ggml.quants`` reshape arrays into blocks and back.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ...errors import LlamapyError
from ..types import TRAITS, GGMLType


class QuantError(LlamapyError, ValueError):
    """Bad input to quantize/dequantize (wrong type, shape or size); the message says what and where."""


QUANTS: dict[GGMLType, type[BlockQuant]] = {}


class BlockQuant:
    """One block type. Subclasses set ``ggml_type`` and implement the block codecs as classmethods."""

    ggml_type: ClassVar[GGMLType]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    #: whether ``quantize_blocks`` is implemented
    can_quantize: ClassVar[bool] = False
    #: whether ``quantize_blocks`` uses importance weights (imatrix)
    uses_imatrix: ClassVar[bool] = False
    #: whether ``quantize`` refuses to run without importance weights (llama.cpp asserts on them)
    requires_imatrix: ClassVar[bool] = False

    def __init__(self) -> None:
        raise TypeError("block codecs are used through their classmethods")

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def quantize_blocks(cls, x: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        raise QuantError(f"quantization to {cls.ggml_type.name} is not implemented")


def register(t: GGMLType):
    """Class decorator: record ``cls`` as the codec of ``t`` (block and type sizes come from TRAITS)."""

    def deco(cls: type[BlockQuant]) -> type[BlockQuant]:
        tr = TRAITS[t]
        cls.ggml_type = t
        cls.block_size = tr.block_size
        cls.type_size = tr.type_size
        cls.can_quantize = cls.quantize_blocks.__func__ is not BlockQuant.quantize_blocks.__func__  # type: ignore[attr-defined]
        if t in QUANTS:
            raise RuntimeError(f"{t.name} registered twice")
        QUANTS[t] = cls
        return cls

    return deco


# ---- small helpers shared by the codecs -------------------------------------------------------------


def f16(b: np.ndarray) -> np.ndarray:
    """uint8[..., 2k] little-endian half floats -> float32[..., k]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def to_f16_bytes(x: np.ndarray) -> np.ndarray:
    """float32[..., k] -> uint8[..., 2k] (round to nearest even, like ggml's FP32_TO_FP16)."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).astype("<f2")).view(np.uint8)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8[nb, ..., m] -> uint8[nb, ..., 2m]: the low nibbles of all bytes, then the high nibbles."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)


def bits(b: np.ndarray, n: int) -> np.ndarray:
    """uint8[..., m] -> uint8[..., n, m]: bit ``i`` (``i`` < n) of every byte on axis -2."""
    sh = np.arange(n, dtype=np.uint8).reshape((n, 1))
    return (b[..., None, :] >> sh) & np.uint8(1)


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: round half to even (for |x| < 2**22), as int32."""
    return np.rint(x).astype(np.int32)


def roundf(x: np.ndarray) -> np.ndarray:
    """C ``roundf``: round half away from zero."""
    a = np.abs(x)
    r = np.floor(a)
    r = r + (a - r >= np.float32(0.5))
    return np.copysign(r, x).astype(np.float32)
