"""The registry of block types and the base class every per-type codec derives from.

A codec works on whole blocks: ``dequantize_blocks(uint8[nb, type_size]) -> float32[nb, block_size]``
and ``quantize_blocks(float32[nb, block_size], weights float32[nb, block_size] | None) -> uint8[nb,
type_size]``. The public functions in ``llamapy.ggml.quants`` reshape arrays into blocks and back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from ...errors import LlamapyError
from ..types import TRAITS, GGMLType


class QuantError(LlamapyError, ValueError):
    """Bad input to quantize/dequantize (wrong type, shape or size); the message says what and where."""


class _Registry(dict):  # type: ignore[type-arg]
    """``QUANTS``: the codec modules (``legacy``, ``kquants``, ``iquants``, with their Numba quantizers:
    6-8 ms of imports) register their classes when something first reads it, not when the package is
    imported: running a model reads none of them (its kernels are in ``fast`` and ``ggml.cpu``)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._done = self._loading = False

    def _load(self) -> None:
        if self._done:
            return
        with self._lock:
            if self._done or self._loading:  # loaded meanwhile, or a codec module's register() asking
                return
            self._loading = True
            try:
                from . import iquants, kquants, legacy  # noqa: F401  (each registers its codecs)
            finally:
                self._loading = False
            self._done = True

    def __getitem__(self, k: GGMLType) -> type[BlockQuant]:
        self._load()
        return super().__getitem__(k)

    def get(self, k: Any, default: Any = None) -> Any:
        self._load()
        return super().get(k, default)

    def __contains__(self, k: object) -> bool:
        self._load()
        return super().__contains__(k)

    def __iter__(self) -> Iterator[GGMLType]:
        self._load()
        return super().__iter__()

    def __len__(self) -> int:
        self._load()
        return super().__len__()

    def keys(self) -> Any:
        self._load()
        return super().keys()

    def values(self) -> Any:
        self._load()
        return super().values()

    def items(self) -> Any:
        self._load()
        return super().items()

    def __repr__(self) -> str:
        self._load()
        return super().__repr__()

    def __eq__(self, other: object) -> bool:
        self._load()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


QUANTS: dict[GGMLType, type[BlockQuant]] = _Registry()


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
        if dict.__contains__(QUANTS, t):
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
