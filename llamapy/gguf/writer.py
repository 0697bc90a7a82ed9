"""GGUF writer (version 3, little-endian).

The simple path::

    w = GGUFWriter(path, arch="llama")
    w.add_key_value("llama.context_length", 2048)            # type inferred (int -> INT32)
    w.add_key_value("llama.rope.freq_base", 1e4, GGUFValueType.FLOAT32)
    w.add_tensor("token_embd.weight", np.zeros((32000, 64), np.float32))
    w.add_tensor("blk.0.attn_q.weight", raw_q8_0_bytes, ggml_type=GGMLType.Q8_0)  # uint8[..., row_bytes]
    w.write()

Streaming (never holds the model): declare every tensor with ``add_tensor_info`` first, then hand the
data over one tensor at a time with ``write_tensor_data`` (in declaration order), then ``close()``.

Shapes given to this module are in NumPy order (outermost first); the file stores ggml's ``ne`` (reversed).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from .._dataclass import dataclass
from ..ggml.types import TRAITS, GGMLType
from .constants import (
    GGML_MAX_NAME,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_ALIGNMENT,
    GGUF_MAX_DIMS,
    KEY_ALIGNMENT,
    KEY_ARCHITECTURE,
    SCALAR_FORMATS,
    GGUFValueType,
)
from .reader import GGUFError
from .strings import StringArray

GGUF_WRITE_VERSION = 3

_INT_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    GGUFValueType.UINT8: (0, 0xFF),
    GGUFValueType.INT8: (-0x80, 0x7F),
    GGUFValueType.UINT16: (0, 0xFFFF),
    GGUFValueType.INT16: (-0x8000, 0x7FFF),
    GGUFValueType.UINT32: (0, 0xFFFFFFFF),
    GGUFValueType.INT32: (-(1 << 31), (1 << 31) - 1),
    GGUFValueType.UINT64: (0, (1 << 64) - 1),
    GGUFValueType.INT64: (-(1 << 63), (1 << 63) - 1),
}
_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)

# numpy dtype kind+size -> value type (for inference from numpy scalars and arrays)
_DTYPE_TO_VT: dict[str, GGUFValueType] = {
    "u1": GGUFValueType.UINT8,
    "i1": GGUFValueType.INT8,
    "u2": GGUFValueType.UINT16,
    "i2": GGUFValueType.INT16,
    "u4": GGUFValueType.UINT32,
    "i4": GGUFValueType.INT32,
    "u8": GGUFValueType.UINT64,
    "i8": GGUFValueType.INT64,
    "f4": GGUFValueType.FLOAT32,
    "f8": GGUFValueType.FLOAT64,
    "b1": GGUFValueType.BOOL,
}
# numpy dtype -> ggml type, for tensors given without an explicit ggml_type
_DTYPE_TO_GGML: dict[str, GGMLType] = {
    "f4": GGMLType.F32,
    "f2": GGMLType.F16,
    "f8": GGMLType.F64,
    "i1": GGMLType.I8,
    "i2": GGMLType.I16,
    "i4": GGMLType.I32,
    "i8": GGMLType.I64,
}


def _dtype_key(dt: np.dtype) -> str:
    return f"{dt.kind}{dt.itemsize}"


def _infer_int(values: Sequence[int]) -> GGUFValueType:
    lo, hi = (min(values), max(values)) if len(values) else (0, 0)
    for vt in (GGUFValueType.INT32, GGUFValueType.INT64, GGUFValueType.UINT64):
        a, b = _INT_RANGES[vt]
        if a <= lo and hi <= b:
            return vt
    raise GGUFError(f"integer {hi if hi > 0 else lo} does not fit any GGUF integer type")


def infer_value_type(value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    """(type, array element type) for a Python or NumPy value: bool -> BOOL, int -> INT32 (INT64 /
    UINT64 when it does not fit), float -> FLOAT32, str -> STRING, NumPy scalars and arrays by dtype,
    lists by their elements (ints widened to fit all of them; any float makes FLOAT32)."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL, None
    if isinstance(value, np.generic):
        vt = _DTYPE_TO_VT.get(_dtype_key(value.dtype))
        if vt is None:
            raise GGUFError(f"cannot store a NumPy {value.dtype} scalar in GGUF")
        return vt, None
    if isinstance(value, int):
        return _infer_int([value]), None
    if isinstance(value, float):
        return GGUFValueType.FLOAT32, None
    if isinstance(value, str):
        return GGUFValueType.STRING, None
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise GGUFError(f"GGUF arrays are 1-D; got a NumPy array of shape {value.shape}")
        if value.dtype.kind in "US":
            return GGUFValueType.ARRAY, GGUFValueType.STRING
        vt = _DTYPE_TO_VT.get(_dtype_key(value.dtype))
        if vt is None:
            raise GGUFError(f"cannot store a NumPy {value.dtype} array in GGUF")
        return GGUFValueType.ARRAY, vt
    if isinstance(value, StringArray):
        return GGUFValueType.ARRAY, GGUFValueType.STRING
    if isinstance(value, (list, tuple)):
        if not value:
            raise GGUFError("cannot infer the element type of an empty array: pass sub_type")
        kinds = {infer_value_type(v)[0] for v in value}
        if kinds <= set(_INT_RANGES) and not any(isinstance(v, (bool, np.bool_)) for v in value):
            return GGUFValueType.ARRAY, _infer_int([int(v) for v in value])
        if kinds <= set(_INT_RANGES) | set(_FLOATS):
            return GGUFValueType.ARRAY, GGUFValueType.FLOAT32
        if len(kinds) == 1:
            return GGUFValueType.ARRAY, kinds.pop()
        raise GGUFError(f"array mixes element types {sorted(k.name for k in kinds)}")
    raise GGUFError(f"cannot store a value of Python type {type(value).__name__} in GGUF")


def _enc_string(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", errors="surrogateescape") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(raw)) + raw


def _enc_scalar(vt: GGUFValueType, v: Any, what: str) -> bytes:
    if vt == GGUFValueType.BOOL:
        if not isinstance(v, (bool, np.bool_, int, np.integer)) or int(v) not in (0, 1):
            raise GGUFError(f"{what}: {v!r} is not a bool")
        return b"\x01" if v else b"\x00"
    if vt in _INT_RANGES:
        if isinstance(v, (float, np.floating)) or not isinstance(v, (int, np.integer)):
            raise GGUFError(f"{what}: {v!r} is not an integer ({vt.name})")
        lo, hi = _INT_RANGES[vt]
        if not lo <= int(v) <= hi:
            raise GGUFError(f"{what}: {v} is out of range for {vt.name}")
        return struct.pack(SCALAR_FORMATS[vt][0], int(v))
    if vt in _FLOATS:
        if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
            raise GGUFError(f"{what}: {v!r} is not a number ({vt.name})")
        return _floats(np.asarray(v), np.dtype(SCALAR_FORMATS[vt][1]), what).tobytes()
    raise GGUFError(f"{what}: {vt.name} is not a scalar type")


def _floats(x: np.ndarray, dt: np.dtype, what: str) -> np.ndarray:
    """``x`` as float type ``dt``, refusing finite values that would become infinite."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(dt)
        bad = np.isfinite(x.astype(np.float64)) & ~np.isfinite(y)
    if bad.any():
        raise GGUFError(f"{what}: {x[bad].reshape(-1)[0]!r} is out of range for {dt.name} (use FLOAT64)")
    return y


def encode_value(
    value: Any, vtype: GGUFValueType | None = None, sub_type: GGUFValueType | None = None, what: str = "value"
) -> bytes:
    """The bytes of a value (without its type tag, except inside arrays where the element type is part
    of the array header). Types are inferred when not given."""
    if vtype is None:
        vtype, inferred_sub = infer_value_type(value)
        sub_type = sub_type if sub_type is not None else inferred_sub
    vtype = GGUFValueType(vtype)
    if vtype == GGUFValueType.STRING:
        if not isinstance(value, (str, bytes)):
            raise GGUFError(f"{what}: {value!r} is not a string")
        return _enc_string(value)
    if vtype != GGUFValueType.ARRAY:
        return _enc_scalar(vtype, value, what)
    if isinstance(value, StringArray):  # read from a GGUF file: its encoding, copied as it is
        if sub_type is not None and GGUFValueType(sub_type) != GGUFValueType.STRING:
            raise GGUFError(f"{what}: strings cannot be written as {GGUFValueType(sub_type).name}")
        return struct.pack("<IQ", int(GGUFValueType.STRING), len(value)) + value.raw
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
        raise GGUFError(f"{what}: {type(value).__name__} is not an array")
    if sub_type is None:
        _, sub_type = infer_value_type(value)
    et = GGUFValueType(sub_type)
    head = struct.pack("<IQ", int(et), len(value))
    if et in SCALAR_FORMATS:
        if et == GGUFValueType.BOOL:
            parts = [_enc_scalar(et, v, f"{what}[{i}]") for i, v in enumerate(value)]
            return head + b"".join(parts)
        dt = np.dtype(SCALAR_FORMATS[et][1])
        arr = np.asarray(value)
        if arr.ndim != 1 and len(value):
            raise GGUFError(f"{what}: not a flat array of {et.name}")
        if et in _INT_RANGES and len(value):
            if arr.dtype.kind not in "iub":
                raise GGUFError(f"{what}: elements are not integers ({et.name})")
            lo, hi = _INT_RANGES[et]
            if int(arr.min()) < lo or int(arr.max()) > hi:
                raise GGUFError(f"{what}: elements out of range for {et.name}")
        elif et in _FLOATS and len(value):
            if arr.dtype.kind not in "iuf":
                raise GGUFError(f"{what}: elements are not numbers ({et.name})")
            return head + np.ascontiguousarray(_floats(arr, dt, what)).tobytes()
        return head + np.ascontiguousarray(arr, dtype=dt).tobytes()
    if et == GGUFValueType.STRING:
        return head + b"".join(
            encode_value(v, GGUFValueType.STRING, None, f"{what}[{i}]") for i, v in enumerate(value)
        )
    # nested arrays: every element carries its own element type
    return head + b"".join(
        encode_value(v, GGUFValueType.ARRAY, None, f"{what}[{i}]") for i, v in enumerate(value)
    )


@dataclass
class _PendingTensor:
    name: str
    ne: tuple[int, ...]  # ggml order
    ggml_type: GGMLType
    nbytes: int
    offset: int = 0  # relative to the data section
    data: np.ndarray | None = None
    written: bool = False


def _nbytes(name: str, ne: Sequence[int], t: GGMLType) -> int:
    tr = TRAITS[t]
    if ne[0] % tr.block_size:
        raise GGUFError(
            f"tensor {name!r}: row of {ne[0]} elements is not a multiple of the {t.name} block size {tr.block_size}"
        )
    n = 1
    for d in ne:
        n *= d
    return n // tr.block_size * tr.type_size


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bits (round to nearest even, NaN kept quiet), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


class GGUFWriter:
    """Writes one GGUF v3 file. See the module docstring for the two ways to use it."""

    def __init__(
        self, path: str | os.PathLike, arch: str | None = None, alignment: int = GGUF_DEFAULT_ALIGNMENT
    ) -> None:
        self.path = os.fspath(path)
        self._kv: dict[str, bytes] = {}  # key -> type tag + value bytes
        self._tensors: dict[str, _PendingTensor] = {}
        self._order: list[_PendingTensor] = []
        self._fout: BinaryIO | None = None
        self._state = "collecting"  # -> "data" (header written) -> "done"
        self._next = 0  # index of the next tensor whose data is due
        self._pos = 0  # bytes written to the data section
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        if arch is not None:
            self.add_key_value(KEY_ARCHITECTURE, arch, GGUFValueType.STRING)
        if alignment != GGUF_DEFAULT_ALIGNMENT:
            self.add_key_value(KEY_ALIGNMENT, alignment, GGUFValueType.UINT32)

    # -- metadata ------------------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self._state != "collecting":
            raise GGUFError(f"{self.path}: cannot {what} after the header was written")

    def add_key_value(
        self, key: str, value: Any, type: GGUFValueType | None = None, sub_type: GGUFValueType | None = None
    ) -> None:
        """Add one metadata entry; ``type`` (and ``sub_type`` for arrays) default to inference."""
        self._check_open(f"add key {key!r}")
        if not isinstance(key, str) or not key:
            raise GGUFError(f"metadata key must be a non-empty string, got {key!r}")
        if key in self._kv:
            raise GGUFError(f"duplicate metadata key {key!r}")
        if type is None:
            type, inferred = infer_value_type(value)
            sub_type = sub_type if sub_type is not None else inferred
        type = GGUFValueType(type)
        if key == KEY_ALIGNMENT:
            self._set_alignment(type, value)
        self._kv[key] = struct.pack("<I", int(type)) + encode_value(
            value, type, sub_type, f"value of {key!r}"
        )

    def add_key_value_raw(self, key: str, type: GGUFValueType, raw: bytes) -> None:
        """Add a value already encoded as GGUF (``GGUFReader.raw_value(key)``): an exact copy."""
        self._check_open(f"add key {key!r}")
        if not isinstance(key, str) or not key:
            raise GGUFError(f"metadata key must be a non-empty string, got {key!r}")
        if key in self._kv:
            raise GGUFError(f"duplicate metadata key {key!r}")
        type = GGUFValueType(type)
        if key == KEY_ALIGNMENT:
            self._set_alignment(type, struct.unpack("<I", raw)[0] if len(raw) == 4 else raw)
        self._kv[key] = struct.pack("<I", int(type)) + bytes(raw)

    def _set_alignment(self, type: GGUFValueType, a: Any) -> None:
        if (
            type != GGUFValueType.UINT32
            or not isinstance(a, (int, np.integer))
            or a <= 0
            or a & (a - 1)
            or a > GGUF_MAX_ALIGNMENT
        ):
            raise GGUFError(
                f"{KEY_ALIGNMENT} must be a UINT32 power of two in 1..{GGUF_MAX_ALIGNMENT}, got {a!r}"
            )
        self.alignment = int(a)

    def add_metadata(self, items: Mapping[str, Any], int_type: GGUFValueType | None = None) -> None:
        """Add several entries with inferred types; with ``int_type`` every Python int (not a bool) is
        stored as that type instead (``UINT32``: as llama.cpp's converters store hyperparameters)."""
        for k, v in items.items():
            if int_type is not None and isinstance(v, int) and not isinstance(v, bool):
                self.add_key_value(k, v, int_type)
            else:
                self.add_key_value(k, v)

    def add_uint8(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.UINT8)

    def add_int8(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.INT8)

    def add_uint16(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.UINT16)

    def add_int16(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.INT16)

    def add_uint32(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.UINT32)

    def add_int32(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.INT32)

    def add_uint64(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.UINT64)

    def add_int64(self, key: str, v: int) -> None:
        self.add_key_value(key, v, GGUFValueType.INT64)

    def add_float32(self, key: str, v: float) -> None:
        self.add_key_value(key, v, GGUFValueType.FLOAT32)

    def add_float64(self, key: str, v: float) -> None:
        self.add_key_value(key, v, GGUFValueType.FLOAT64)

    def add_bool(self, key: str, v: bool) -> None:
        self.add_key_value(key, v, GGUFValueType.BOOL)

    def add_string(self, key: str, v: str) -> None:
        self.add_key_value(key, v, GGUFValueType.STRING)

    def add_array(
        self, key: str, v: Sequence[Any] | np.ndarray, sub_type: GGUFValueType | None = None
    ) -> None:
        self.add_key_value(key, v, GGUFValueType.ARRAY, sub_type)

    # -- tensors -------------------------------------------------------------------------------
    def add_tensor_info(
        self, name: str, shape: Sequence[int], ggml_type: GGMLType | int | str, nbytes: int | None = None
    ) -> None:
        """Declare a tensor (shape in NumPy order, in elements) whose data will come through
        ``write_tensor_data``; ``nbytes``, when given, must match the shape and type."""
        self._check_open(f"add tensor {name!r}")
        t = GGMLType[ggml_type.upper()] if isinstance(ggml_type, str) else GGMLType(ggml_type)
        if not isinstance(name, str) or not name:
            raise GGUFError(f"tensor name must be a non-empty string, got {name!r}")
        if name in self._tensors:
            raise GGUFError(f"duplicate tensor name {name!r}")
        if len(name.encode("utf-8", errors="surrogateescape")) >= GGML_MAX_NAME:
            raise GGUFError(f"tensor name {name!r} is too long (at most {GGML_MAX_NAME - 1} bytes)")
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= GGUF_MAX_DIMS or any(d <= 0 for d in shape):
            raise GGUFError(
                f"tensor {name!r}: shape {shape} must have 1..{GGUF_MAX_DIMS} positive dimensions"
            )
        ne = tuple(reversed(shape))
        size = _nbytes(name, ne, t)
        if nbytes is not None and int(nbytes) != size:
            raise GGUFError(f"tensor {name!r}: {nbytes} bytes given, but {t.name}{list(shape)} takes {size}")
        pt = _PendingTensor(name, ne, t, size)
        self._tensors[name] = pt
        self._order.append(pt)

    def add_tensor(
        self,
        name: str,
        array: np.ndarray,
        ggml_type: GGMLType | int | str | None = None,
        raw_shape: Sequence[int] | None = None,
    ) -> None:
        """Add a tensor with its data (kept by reference until written; not copied).

        - plain arrays (float32/16/64, int8/16/32/64) are stored as their type, or converted when
          ``ggml_type`` is another float type (F32, F16, BF16, F64) or a quantized type (through
          ``llamapy.ggml.quants.quantize``);
        - raw bytes (``uint8``) with a block type or BF16: last axis in bytes (gguf-py's convention),
          or any layout with ``raw_shape`` giving the element shape in NumPy order.
        """
        array = np.asarray(array)
        t = None
        if ggml_type is not None:
            t = GGMLType[ggml_type.upper()] if isinstance(ggml_type, str) else GGMLType(ggml_type)
        if array.dtype == np.uint8:
            if t is None:
                raise GGUFError(f"tensor {name!r}: raw uint8 data needs ggml_type")
            tr = TRAITS[t]
            if raw_shape is not None:
                shape = tuple(raw_shape)
            elif tr.dtype is not None and tr.dtype.itemsize == 1:
                shape = array.shape
            else:
                if array.ndim == 0 or array.shape[-1] % tr.type_size:
                    raise GGUFError(
                        f"tensor {name!r}: last axis of {array.shape[-1] if array.ndim else 0} bytes is not a "
                        f"multiple of the {t.name} block of {tr.type_size} bytes"
                    )
                shape = (*array.shape[:-1], array.shape[-1] // tr.type_size * tr.block_size)
            data = np.ascontiguousarray(array).reshape(-1)
        else:
            key = _dtype_key(array.dtype)
            if t is None:
                t = _DTYPE_TO_GGML.get(key)
                if t is None:
                    raise GGUFError(
                        f"tensor {name!r}: no ggml type for NumPy dtype {array.dtype}; pass ggml_type"
                    )
            tr = TRAITS[t]
            shape = tuple(raw_shape) if raw_shape is not None else array.shape
            if tr.dtype is not None and _dtype_key(tr.dtype) == key:
                data = np.ascontiguousarray(array, dtype=tr.dtype)
            elif t in (GGMLType.F32, GGMLType.F16, GGMLType.F64) and array.dtype.kind in "fiu":
                data = np.ascontiguousarray(array, dtype=tr.dtype)
            elif t == GGMLType.BF16 and array.dtype.kind in "fiu":
                data = _to_bf16(array)
            elif tr.quantized and array.dtype.kind == "f":
                try:
                    from ..ggml.quants import quantize
                except ImportError as e:
                    raise GGUFError(
                        f"tensor {name!r}: quantizing to {t.name} needs llamapy.ggml.quants ({e})"
                    ) from None
                data = np.ascontiguousarray(quantize(np.asarray(array, dtype=np.float32), t))
            else:
                raise GGUFError(f"tensor {name!r}: cannot store a {array.dtype} array as {t.name}")
            data = data.reshape(-1).view(np.uint8)
        if array.ndim == 0 and raw_shape is None:
            shape = (1,)
        self.add_tensor_info(name, shape, t)
        pt = self._tensors[name]
        if data.nbytes != pt.nbytes:
            del self._tensors[name]
            self._order.pop()
            raise GGUFError(
                f"tensor {name!r}: {data.nbytes} bytes of data, but {t.name}{list(shape)} takes {pt.nbytes}"
            )
        pt.data = data

    # -- output --------------------------------------------------------------------------------
    def _pad(self, n: int) -> int:
        return -n % self.alignment

    def write_header(self) -> None:
        """Write header, metadata and tensor infos (done automatically by the first data write)."""
        self._check_open("write the header")
        off = 0
        for pt in self._order:
            pt.offset = off
            off += pt.nbytes + self._pad(pt.nbytes)
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_WRITE_VERSION, len(self._order), len(self._kv))]
        for k, v in self._kv.items():
            parts += [_enc_string(k), v]
        for pt in self._order:
            parts += [_enc_string(pt.name), struct.pack("<I", len(pt.ne))]
            parts.append(struct.pack(f"<{len(pt.ne)}q", *pt.ne))
            parts.append(struct.pack("<IQ", int(pt.ggml_type), pt.offset))
        head = b"".join(parts)
        try:
            self._fout = open(self.path, "wb")
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot write: {e.strerror or e}") from None
        self._fout.write(head + b"\x00" * self._pad(len(head)))
        self._state = "data"

    def write_tensor_data(self, data: np.ndarray | bytes | memoryview, name: str | None = None) -> None:
        """Write the data of the next declared tensor (declaration order); ``name`` is checked if given."""
        if self._state == "collecting":
            self.write_header()
        if self._state != "data" or self._next >= len(self._order):
            raise GGUFError(f"{self.path}: no tensor is waiting for data")
        pt = self._order[self._next]
        if name is not None and name != pt.name:
            raise GGUFError(f"{self.path}: data for tensor {name!r} given, but {pt.name!r} is next")
        buf = memoryview(
            np.ascontiguousarray(data).reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data
        ).cast("B")
        if buf.nbytes != pt.nbytes:
            raise GGUFError(f"{self.path}: tensor {pt.name!r} takes {pt.nbytes} bytes, {buf.nbytes} given")
        assert self._fout is not None
        self._fout.write(buf)
        self._fout.write(b"\x00" * self._pad(pt.nbytes))
        pt.written = True
        pt.data = None
        self._next += 1

    def write(self) -> None:
        """Write everything still pending (header, data of ``add_tensor`` tensors) and close the file."""
        if self._state == "done":
            return
        if self._state == "collecting":
            self.write_header()
        while self._next < len(self._order):
            pt = self._order[self._next]
            if pt.data is None:
                self.abort()
                raise GGUFError(
                    f"{self.path}: tensor {pt.name!r} was declared but its data was never written"
                )
            self.write_tensor_data(pt.data)
        self._finish()

    def _finish(self) -> None:
        if self._fout is not None:
            self._fout.close()
            self._fout = None
        self._state = "done"

    def abort(self) -> None:
        """Close the file without finishing it (after an error)."""
        self._finish()

    def close(self) -> None:
        """Finish the file (same as ``write()``)."""
        self.write()

    def __enter__(self) -> GGUFWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
