"""Strict GGUF reader (versions 2 and 3).

Every length, count and offset read from the file is checked against the bytes that remain before
anything is allocated, so a malformed or hostile file raises :class:`GGUFError` (naming what is wrong
and the byte offset) instead of hanging, allocating gigabytes or crashing.

Tensor shapes: ``TensorInfo.ne`` is ggml's order (``ne[0]`` is the contiguous axis); ``TensorInfo.shape``
is NumPy's order (the reverse), used by everything above this layer.
"""

from __future__ import annotations

import mmap as _mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import field
from typing import Any

import numpy as np

from .._dataclass import dataclass
from ..ggml.types import TRAITS, GGMLType
from .constants import (
    GGML_MAX_NAME,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_ALIGNMENT,
    GGUF_MAX_DIMS,
    GGUF_VERSIONS,
    KEY_ALIGNMENT,
    MAX_ARRAY_LENGTH,
    MAX_NESTED_VALUES,
    MAX_STRING_LENGTH,
    SCALAR_FORMATS,
    GGUFValueType,
)
from .strings import scan_strings

_INT64_MAX = (1 << 63) - 1
#: string arrays of at least this many elements (vocabularies, merges) are read as a StringArray
STRING_ARRAY_MIN = 1024
_REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8", 36: "IQ4_NL_4_4",
                  37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}  # fmt: skip
# smallest encodings, used to bound counts by the bytes left in the file
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset


class GGUFError(ValueError):
    """A GGUF file is malformed, unsupported or inconsistent."""


@dataclass
class GGUFField:
    """One metadata key/value; ``sub_type`` is the element type of an array."""

    key: str
    type: GGUFValueType
    value: Any
    sub_type: GGUFValueType | None = None
    offset: int = 0  # where the record (its key) starts
    value_range: tuple[int, int] = (0, 0)  # [start, end) of the encoded value, after the type tag


@dataclass
class TensorInfo:
    """One tensor of a GGUF file: name, type, shape (ggml order) and its bytes in the file."""

    name: str
    ggml_type: GGMLType
    ne: tuple[int, ...]  # ggml order
    offset: int  # absolute byte offset in the file
    nbytes: int
    data: np.ndarray = field(repr=False)  # raw bytes, uint8, 1-D

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order (outermost first, last axis contiguous)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    def array(self) -> np.ndarray:
        """A typed view: plain types as their dtype in NumPy order; block types (and BF16) as
        ``uint8[..., row_bytes]`` (gguf-py's convention for ``dequantize``)."""
        tr = TRAITS[self.ggml_type]
        if tr.dtype is not None:
            return self.data.view(tr.dtype).reshape(self.shape)
        row_bytes = self.ne[0] // tr.block_size * tr.type_size
        return self.data.reshape(*self.shape[:-1], row_bytes)


class _Cursor:
    def __init__(self, buf: memoryview, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"{what} at offset {self.pos}: needs {n} bytes, only {self.size - self.pos} left in the file"
            )

    def unpack(self, fmt: str, n: int, what: str) -> Any:
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.unpack("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", 8, what)

    def i64(self, what: str) -> int:
        return self.unpack("<q", 8, what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > MAX_STRING_LENGTH:
            raise GGUFError(
                f"{what} at offset {start}: string length {n} is above the limit {MAX_STRING_LENGTH}"
            )
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")


class _NestedBudget:
    """Values the file's nested arrays may still hold (each one a Python object: ``MAX_NESTED_VALUES``
    for the whole file), so that millions of tiny sub-arrays fail at once instead of taking minutes."""

    def __init__(self) -> None:
        self.left = MAX_NESTED_VALUES

    def take(self, n: int, what: str, start: int) -> None:
        self.left -= n
        if self.left < 0:
            raise GGUFError(
                f"{what} at offset {start}: nested arrays hold more than {MAX_NESTED_VALUES} values in all "
                f"(this array has {n})"
            )


def _value(
    cur: _Cursor, vtype: int, what: str, depth: int = 0, budget: _NestedBudget | None = None
) -> tuple[Any, GGUFValueType | None]:
    """Read one value of type ``vtype``; returns (value, array element type or None). ``budget``: what
    nested arrays may still hold (inside an array of arrays; None: a fresh one)."""
    start = cur.pos
    try:
        vt = GGUFValueType(vtype)
    except ValueError:
        raise GGUFError(f"{what} at offset {start}: unknown value type {vtype}") from None
    if vt == GGUFValueType.STRING:
        return cur.string(what), None
    if vt != GGUFValueType.ARRAY:
        fmt, _ = SCALAR_FORMATS[vt]
        n = struct.calcsize(fmt)
        v = cur.unpack(fmt, n, what)
        if vt == GGUFValueType.BOOL:
            v = bool(v)
        return v, None
    if depth > 4:
        raise GGUFError(f"{what} at offset {start}: arrays nested too deeply")
    etype = cur.u32(f"element type of {what}")
    try:
        et = GGUFValueType(etype)
    except ValueError:
        raise GGUFError(f"{what} at offset {start}: unknown array element type {etype}") from None
    n = cur.u64(f"length of {what}")
    if n > MAX_ARRAY_LENGTH:
        raise GGUFError(f"{what} at offset {start}: array length {n} is above the limit {MAX_ARRAY_LENGTH}")
    if et in SCALAR_FORMATS:
        fmt, dt = SCALAR_FORMATS[et]
        nb = n * struct.calcsize(fmt)
        cur.need(nb, what)
        arr = np.frombuffer(cur.buf, dtype=dt, count=n, offset=cur.pos).copy()
        if et == GGUFValueType.BOOL:
            arr = arr.astype(bool)
        cur.pos += nb
        return arr, et
    # strings and nested arrays: every element takes at least 8 bytes (a length)
    cur.need(n * 8, what)
    if et == GGUFValueType.STRING and n >= STRING_ARRAY_MIN:  # a vocabulary: kept encoded (gguf/strings.py)
        arr = scan_strings(cur.buf, cur.pos, cur.size, n, what, GGUFError)
        cur.pos += len(arr.raw)
        return arr, et
    if depth > 0 and budget is not None and et == GGUFValueType.STRING:
        budget.take(n, what, start)  # one Python string each
    if et == GGUFValueType.STRING:
        out = []
        buf, size, pos = cur.buf, cur.size, cur.pos
        unpack = struct.unpack_from
        for i in range(n):
            if pos + 8 > size:
                raise GGUFError(f"{what}[{i}] at offset {pos}: string length past the end of the file")
            ln = unpack("<Q", buf, pos)[0]
            pos += 8
            if ln > size - pos:
                raise GGUFError(
                    f"{what}[{i}] at offset {pos - 8}: string of {ln} bytes runs past the end of the file"
                )
            out.append(bytes(buf[pos : pos + ln]).decode("utf-8", errors="surrogateescape"))
            pos += ln
        cur.pos = pos
        return out, et
    if budget is None:
        budget = _NestedBudget()
    budget.take(n, what, start)  # before reading any: n sub-arrays
    out = [_value(cur, et, f"{what}[{i}]", depth + 1, budget)[0] for i in range(n)]
    return out, et


class GGUFReader:
    """Reads the header, metadata and tensor index of one GGUF file.

    ``mmap=True`` (default) maps the file and tensor data are zero-copy views; ``mmap=False`` reads the
    file into memory.
    """

    def __init__(self, path: str | os.PathLike, mmap: bool = True) -> None:
        self.path = os.fspath(path)
        self._mm: _mmap.mmap | None = None
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 24:
                    raise GGUFError(
                        f"{self.path}: file of {size} bytes is too short for a GGUF header (24 bytes)"
                    )
                if mmap:
                    self._mm = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
                    self._buf = np.frombuffer(self._mm, dtype=np.uint8)
                else:
                    self._buf = np.fromfile(f, dtype=np.uint8, count=size)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read: {e.strerror or e}") from None
        self.file_size = size
        if len(self._buf) != size:
            raise GGUFError(
                f"{self.path}: read {len(self._buf)} of {size} bytes (file changed while reading?)"
            )
        try:
            self._parse()
        except GGUFError as e:
            self.close()
            raise GGUFError(f"{self.path}: {e}") from None

    # -- parsing -------------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(memoryview(self._buf), self.file_size)
        magic = bytes(self._buf[:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"bad magic {magic!r} at offset 0 (expected {GGUF_MAGIC!r}): not a GGUF file")
        cur.pos = 4
        version = cur.u32("version")
        if version not in GGUF_VERSIONS:
            if version == 1:
                raise GGUFError("GGUF version 1 at offset 4 is no longer supported (supported: 2, 3)")
            if version & 0xFFFF == 0 and version != 0:
                raise GGUFError(
                    f"version field {version:#x} at offset 4 looks big-endian; only little-endian GGUF is supported"
                )
            raise GGUFError(f"unsupported GGUF version {version} at offset 4 (supported: 2, 3)")
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        if n_tensors > _INT64_MAX or n_tensors * _MIN_TENSOR_INFO_BYTES > self.file_size:
            raise GGUFError(
                f"tensor count {n_tensors} at offset 8 cannot fit in a file of {self.file_size} bytes"
            )
        if n_kv > _INT64_MAX or n_kv * _MIN_KV_BYTES > self.file_size:
            raise GGUFError(
                f"metadata count {n_kv} at offset 16 cannot fit in a file of {self.file_size} bytes"
            )

        self.fields: dict[str, GGUFField] = {}
        budget = _NestedBudget()
        for i in range(n_kv):
            off = cur.pos
            key = cur.string(f"key of metadata #{i}")
            if not key:
                raise GGUFError(f"metadata #{i} at offset {off} has an empty key")
            if key in self.fields:
                raise GGUFError(f"duplicate metadata key {key!r} at offset {off}")
            vtype = cur.u32(f"value type of {key!r}")
            vstart = cur.pos
            value, sub = _value(cur, vtype, f"value of {key!r}", budget=budget)
            self.fields[key] = GGUFField(key, GGUFValueType(vtype), value, sub, off, (vstart, cur.pos))

        self.alignment = GGUF_DEFAULT_ALIGNMENT
        if KEY_ALIGNMENT in self.fields:
            fa = self.fields[KEY_ALIGNMENT]
            if fa.type != GGUFValueType.UINT32:
                raise GGUFError(
                    f"{KEY_ALIGNMENT} at offset {fa.offset} has type {fa.type.name}, expected UINT32"
                )
            a = fa.value
            if a == 0 or a & (a - 1) or a > GGUF_MAX_ALIGNMENT:
                raise GGUFError(
                    f"{KEY_ALIGNMENT} = {a} at offset {fa.offset} is not a power of two in 1..{GGUF_MAX_ALIGNMENT}"
                )
            self.alignment = a

        infos: list[tuple[str, GGMLType, tuple[int, ...], int, int, int]] = []
        names: set[str] = set()
        for i in range(n_tensors):
            off = cur.pos
            name = cur.string(f"name of tensor #{i}")
            name_len = len(name.encode("utf-8", errors="surrogateescape"))
            if name_len >= GGML_MAX_NAME:
                raise GGUFError(
                    f"tensor #{i} at offset {off}: name of {name_len} bytes is too long (max {GGML_MAX_NAME - 1})"
                )
            if not name:
                raise GGUFError(f"tensor #{i} at offset {off} has an empty name")
            if name in names:
                raise GGUFError(f"duplicate tensor name {name!r} at offset {off}")
            names.add(name)
            n_dims = cur.u32(f"n_dims of tensor {name!r}")
            if not 1 <= n_dims <= GGUF_MAX_DIMS:
                raise GGUFError(
                    f"tensor {name!r} at offset {off}: n_dims {n_dims} outside 1..{GGUF_MAX_DIMS}"
                )
            ne = []
            for _ in range(n_dims):
                d = cur.i64(f"dimension of tensor {name!r}")
                if d <= 0:
                    raise GGUFError(f"tensor {name!r} at offset {off}: dimension {d} is not positive")
                ne.append(d)
            tval = cur.u32(f"type of tensor {name!r}")
            if tval in _REMOVED_TYPES:
                raise GGUFError(
                    f"tensor {name!r} at offset {off}: type {_REMOVED_TYPES[tval]} ({tval}) was removed from ggml"
                )
            try:
                gtype = GGMLType(tval)
            except ValueError:
                raise GGUFError(f"tensor {name!r} at offset {off}: unknown tensor type {tval}") from None
            toff = cur.u64(f"data offset of tensor {name!r}")
            tr = TRAITS.get(gtype)
            if tr is None:
                raise GGUFError(f"tensor {name!r} at offset {off}: tensor type {gtype.name} is not supported")
            n_el = 1
            for d in ne:
                n_el *= d
                if n_el > _INT64_MAX:
                    raise GGUFError(
                        f"tensor {name!r} at offset {off}: element count overflows int64 (shape {ne})"
                    )
            if ne[0] % tr.block_size:
                raise GGUFError(
                    f"tensor {name!r} at offset {off}: row of {ne[0]} elements is not a multiple of the "
                    f"{gtype.name} block size {tr.block_size}"
                )
            nbytes = n_el // tr.block_size * tr.type_size
            if nbytes > self.file_size:
                raise GGUFError(
                    f"tensor {name!r} at offset {off}: {nbytes} bytes of data cannot fit in the file"
                )
            if toff % self.alignment:
                raise GGUFError(
                    f"tensor {name!r} at offset {off}: data offset {toff} is not a multiple of the alignment {self.alignment}"
                )
            infos.append((name, gtype, tuple(ne), toff, nbytes, off))

        pad = -cur.pos % self.alignment
        self.data_offset = cur.pos + pad
        if n_tensors and self.data_offset > self.file_size:
            raise GGUFError(f"data section at offset {self.data_offset} starts past the end of the file")

        self.tensors: list[TensorInfo] = []
        for name, gtype, ne, toff, nbytes, off in infos:
            start = self.data_offset + toff
            if start + nbytes > self.file_size:
                raise GGUFError(
                    f"tensor {name!r} (info at offset {off}): data [{start}, {start + nbytes}) runs past the end "
                    f"of the file ({self.file_size} bytes)"
                )
            self.tensors.append(TensorInfo(name, gtype, ne, start, nbytes, self._buf[start : start + nbytes]))
        prev: TensorInfo | None = None
        for t in sorted(self.tensors, key=lambda t: t.offset):
            if prev is not None and t.offset < prev.offset + prev.nbytes:
                raise GGUFError(f"tensor {t.name!r} data at offset {t.offset} overlaps tensor {prev.name!r}")
            prev = t
        self.tensor_index: dict[str, TensorInfo] = {t.name: t for t in self.tensors}

    # -- access --------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        return {k: f.value for k, f in self.fields.items()}

    def get(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        return default if f is None else f.value

    def raw_value(self, key: str) -> bytes:
        """The encoded bytes of a metadata value (after its type tag), for exact copies."""
        a, b = self.fields[key].value_range
        return bytes(self._buf[a:b])

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors)

    def close(self) -> None:
        self.tensors = []
        self.tensor_index = {}
        self._buf = None  # type: ignore[assignment]
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # views are still alive; the map closes when they go
            self._mm = None

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
