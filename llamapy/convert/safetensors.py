"""The weights of a Hugging Face checkpoint: ``*.safetensors`` files (one, or shards listed in
``model.safetensors.index.json``), memory-mapped.

Each tensor is a read-only NumPy view of the mapped file (BF16 and F8 are returned as their raw
unsigned bits with :attr:`SafeTensor.dtype` naming the type), so reading a model never holds it in
memory twice. The file layout is the one the ``safetensors`` package writes: an 8-byte little-endian
header length, a JSON header (``dtype``, ``shape``, ``data_offsets`` per name), then the data; every
offset is checked against the file size, so a truncated shard is an error naming the file.
:func:`open_checkpoint` falls back on PyTorch ``.bin`` shards (``torch_bin.py``) when there are none.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from .._dataclass import dataclass
from .errors import ConvertError

# safetensors dtype -> (NumPy storage dtype, bytes per element)
_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}

_MAX_HEADER = 100 << 20


@dataclass
class SafeTensor:
    """One tensor of a shard: its safetensors dtype, shape, and the mapped bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    _raw: np.ndarray  # the mapped bytes (uint8)

    def raw(self) -> np.ndarray:
        """The stored values in their storage dtype (BF16 as uint16 bits), read-only, not copied."""
        return self._raw.view(_DTYPES[self.dtype]).reshape(self.shape)

    def numpy(self) -> np.ndarray:
        """The values as float32 (floats; BF16 widened exactly) or their integer type."""
        a = self.raw()
        if self.dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        if self.dtype in ("F8_E4M3", "F8_E5M2"):
            raise ConvertError(
                f"{self.file.name}: tensor {self.name!r} is {self.dtype}, which is not supported"
            )
        if a.dtype.kind == "f":
            return a.astype(np.float32)
        return a


def _read_header(path: Path) -> tuple[dict, int, int]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConvertError(f"{path.name}: not a safetensors file (truncated: {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ConvertError(f"{path.name}: truncated or not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ConvertError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConvertError(f"{path.name}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path.name}: not a safetensors file (its header is not a JSON object)")
    return header, 8 + n, size


class SafetensorsFile:
    """One ``.safetensors`` file, mapped; ``tensors`` in name order (as safetensors and llama.cpp list them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        header, start, size = _read_header(path)
        self._mm: mmap.mmap | None = None
        buf: np.ndarray | None = None
        if size > start:
            with open(path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            buf = np.frombuffer(self._mm, dtype=np.uint8)
        self.tensors: dict[str, SafeTensor] = {}
        for name in sorted(header):
            if name == "__metadata__":
                continue
            meta = header[name]
            try:
                dtype, shape, (a, b) = (
                    meta["dtype"],
                    tuple(int(d) for d in meta["shape"]),
                    meta["data_offsets"],
                )
            except (KeyError, TypeError, ValueError):
                raise ConvertError(f"{path.name}: malformed header entry for tensor {name!r}") from None
            if dtype not in _DTYPES:
                raise ConvertError(f"{path.name}: tensor {name!r} has an unknown dtype {dtype!r}")
            n = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
            if not (0 <= a <= b) or b - a != n:
                raise ConvertError(
                    f"{path.name}: tensor {name!r}: data offsets {a}..{b} do not fit {dtype}{list(shape)}"
                )
            if start + b > size:
                raise ConvertError(
                    f"{path.name} is truncated: tensor {name!r} ends at byte {start + b}, the file has {size}"
                )
            raw = buf[start + a : start + b] if buf is not None else np.zeros(0, np.uint8)
            self.tensors[name] = SafeTensor(name, dtype, shape, path, raw)

    def close(self) -> None:
        self.tensors = {}
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # views still alive: the mapping goes with them
                pass
            self._mm = None


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise ConvertError(f"{index.name}: cannot read its weight_map") from None
    return weight_map


def open_checkpoint(d: Path) -> tuple[dict[str, SafeTensor], list[SafetensorsFile]]:
    """Every tensor of the checkpoint in ``d``, in llama.cpp's order (shards sorted by name, then names
    sorted within a safetensors shard, or in the state dict's order within a PyTorch ``.bin`` shard,
    read when there are no safetensors, as llama.cpp's converter does). A shard named in the index
    but missing, or a tensor of the index absent from the shards, is an error."""
    index = d / "model.safetensors.index.json"
    weight_map: dict[str, str] = {}
    parts = sorted(p.name for p in d.glob("model*.safetensors"))
    is_bin = False
    if not parts and not index.is_file():
        is_bin = True
        index = d / "pytorch_model.bin.index.json"
        parts = sorted(p.name for p in d.glob("pytorch_model*.bin"))
    if index.is_file():
        weight_map = _weight_map(index)
        parts = sorted(set(weight_map.values()))
        missing = [p for p in parts if not (d / p).is_file()]
        if missing:
            raise ConvertError(f"missing model shard(s) {', '.join(missing)} (listed in {index.name})")
    elif not parts:
        parts = sorted(p.name for p in d.glob("*.safetensors") if not p.name.startswith("adapter_"))
        is_bin = not parts
    if not parts:
        raise ConvertError(f"{d}: no model weights (*.safetensors or pytorch_model*.bin)")
    files: list[SafetensorsFile] = []
    try:
        if is_bin:
            from .torch_bin import TorchBinFile

            files += [TorchBinFile(d / p) for p in parts]  # type: ignore[misc]
        else:
            files += [SafetensorsFile(d / p) for p in parts]
    except ConvertError:
        for f in files:
            f.close()
        raise
    tensors: dict[str, SafeTensor] = {}
    for f in files:
        tensors.update(f.tensors)
    if weight_map:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            shards = sorted({weight_map[n] for n in absent})
            raise ConvertError(
                f"incomplete model shard(s) {', '.join(shards)}: {len(absent)} tensor(s) of the index are "
                f"missing, e.g. {absent[0]!r}"
            )
    return tensors, files
