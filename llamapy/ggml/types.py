"""GGML tensor types: llama.cpp's numbering and a traits table.

A tensor of a block type stores ``n / block_size`` blocks of ``type_size`` bytes per row. Float and
integer types are "blocks" of one element.
"""

from __future__ import annotations

import enum

import numpy as np

from .._dataclass import dataclass


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    # 4 (Q4_2) and 5 (Q4_3) were removed from ggml
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    # 31..33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) and 36..38 (IQ4_NL_4_x) were removed
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class TypeTraits:
    """Block size, bytes per block and NumPy dtype of a GGML type."""

    block_size: int  # elements per block
    type_size: int  # bytes per block
    quantized: bool
    dtype: np.dtype | None  # numpy dtype for plain (non-block) types

    @property
    def is_float(self) -> bool:
        return self.dtype is not None and self.dtype.kind == "f"


def _t(bs: int, ts: int, q: bool, dtype: str | None = None) -> TypeTraits:
    return TypeTraits(bs, ts, q, np.dtype(dtype) if dtype else None)


TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: _t(1, 4, False, "<f4"),
    GGMLType.F16: _t(1, 2, False, "<f2"),
    GGMLType.BF16: _t(1, 2, False, None),  # stored as uint16, no numpy dtype
    GGMLType.F64: _t(1, 8, False, "<f8"),
    GGMLType.I8: _t(1, 1, False, "i1"),
    GGMLType.I16: _t(1, 2, False, "<i2"),
    GGMLType.I32: _t(1, 4, False, "<i4"),
    GGMLType.I64: _t(1, 8, False, "<i8"),
    GGMLType.Q4_0: _t(32, 18, True),
    GGMLType.Q4_1: _t(32, 20, True),
    GGMLType.Q5_0: _t(32, 22, True),
    GGMLType.Q5_1: _t(32, 24, True),
    GGMLType.Q8_0: _t(32, 34, True),
    GGMLType.Q8_1: _t(32, 36, True),
    GGMLType.Q2_K: _t(256, 84, True),
    GGMLType.Q3_K: _t(256, 110, True),
    GGMLType.Q4_K: _t(256, 144, True),
    GGMLType.Q5_K: _t(256, 176, True),
    GGMLType.Q6_K: _t(256, 210, True),
    GGMLType.Q8_K: _t(256, 292, True),
    GGMLType.IQ2_XXS: _t(256, 66, True),
    GGMLType.IQ2_XS: _t(256, 74, True),
    GGMLType.IQ3_XXS: _t(256, 98, True),
    GGMLType.IQ1_S: _t(256, 50, True),
    GGMLType.IQ4_NL: _t(32, 18, True),
    GGMLType.IQ3_S: _t(256, 110, True),
    GGMLType.IQ2_S: _t(256, 82, True),
    GGMLType.IQ4_XS: _t(256, 136, True),
    GGMLType.IQ1_M: _t(256, 56, True),
    GGMLType.TQ1_0: _t(256, 54, True),
    GGMLType.TQ2_0: _t(256, 66, True),
    GGMLType.MXFP4: _t(32, 17, True),
}


def traits(t: GGMLType | int) -> TypeTraits:
    tr = TRAITS.get(t)  # type: ignore[call-overload]  # an int equal to a member finds it: no enum call
    return tr if tr is not None else TRAITS[GGMLType(t)]


def row_size(t: GGMLType | int, n: int) -> int:
    """Bytes taken by ``n`` elements of type ``t`` (``n`` must be a multiple of the block size)."""
    tr = traits(t)
    if n % tr.block_size:
        raise ValueError(
            f"{GGMLType(t).name}: {n} elements is not a multiple of the block size {tr.block_size}"
        )
    return n // tr.block_size * tr.type_size


def type_from_name(name: str) -> GGMLType:
    """``"q8_0"`` / ``"Q8_0"`` / ``"f16"`` -> GGMLType, with a clear error."""
    try:
        return GGMLType[name.upper()]
    except KeyError:
        known = ", ".join(t.name.lower() for t in GGMLType)
        raise ValueError(f"unknown ggml type {name!r} (known: {known})") from None
