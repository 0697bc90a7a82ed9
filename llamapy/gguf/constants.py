"""GGUF file-format constants (see llama.cpp's ggml/include/gguf.h and gguf-py)."""

from __future__ import annotations

import enum

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
# An alignment above this is refused as hostile (llama.cpp accepts any power of two; files use 32).
GGUF_MAX_ALIGNMENT = 1 << 16
GGUF_MAX_DIMS = 4
GGML_MAX_NAME = 64  # tensor names are shorter than this (ggml's fixed name buffer)
# Sanity limits on lengths read from the file; they are also bounded by the remaining bytes.
MAX_STRING_LENGTH = 1 << 30
MAX_ARRAY_LENGTH = 1 << 31
# Values held by arrays of arrays, in all, in one file (each is a Python object; llama.cpp refuses nested
# arrays outright, and no model file has more than a handful).
MAX_NESTED_VALUES = 1 << 16

KEY_ALIGNMENT = "general.alignment"
KEY_ARCHITECTURE = "general.architecture"
KEY_NAME = "general.name"
KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"


class GGUFValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format and numpy dtype of each scalar value type
SCALAR_FORMATS: dict[GGUFValueType, tuple[str, str]] = {
    GGUFValueType.UINT8: ("<B", "<u1"),
    GGUFValueType.INT8: ("<b", "<i1"),
    GGUFValueType.UINT16: ("<H", "<u2"),
    GGUFValueType.INT16: ("<h", "<i2"),
    GGUFValueType.UINT32: ("<I", "<u4"),
    GGUFValueType.INT32: ("<i", "<i4"),
    GGUFValueType.FLOAT32: ("<f", "<f4"),
    GGUFValueType.BOOL: ("<?", "<u1"),
    GGUFValueType.UINT64: ("<Q", "<u8"),
    GGUFValueType.INT64: ("<q", "<i8"),
    GGUFValueType.FLOAT64: ("<d", "<f8"),
}
