"""PyTorch ``.bin`` checkpoints (``pytorch_model.bin``, or shards listed in
``pytorch_model.bin.index.json``) read without torch: the zip archive ``torch.save`` writes since
PyTorch 1.6, its ``data.pkl`` state dict unpickled by a restricted unpickler, and every storage
(``<archive>/data/<key>``, stored uncompressed) memory-mapped with NumPy.

The unpickler resolves only what a state dict needs: ``collections.OrderedDict``,
``torch._utils._rebuild_tensor_v2`` / ``_rebuild_parameter`` and the dtype storage classes
(``torch.FloatStorage``, ``HalfStorage``, ``BFloat16Storage``, ...), each replaced by a harmless
stand-in of our own, plus the ``('storage', type, key, location, numel)`` persistent ids. Any other
global (``os.system``, ``builtins.eval``, ...) is refused before anything is called, so a hostile
pickle runs nothing. Tensors keep their storage offset and strides (a view of a larger storage, a
transposed tensor, two names sharing one storage), checked against the storage's size.
"""

from __future__ import annotations

import collections
import io
import math
import mmap
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConvertError
from .safetensors import _DTYPES, SafeTensor

# torch storage class -> safetensors dtype name (its NumPy storage dtype is safetensors._DTYPES[name])
_STORAGES: dict[str, str] = {
    "FloatStorage": "F32",
    "HalfStorage": "F16",
    "BFloat16Storage": "BF16",
    "DoubleStorage": "F64",
    "LongStorage": "I64",
    "IntStorage": "I32",
    "ShortStorage": "I16",
    "CharStorage": "I8",
    "ByteStorage": "U8",
    "BoolStorage": "BOOL",
}

_MAX_PICKLE = 256 << 20  # a state dict's pickle holds names and shapes only


class _Frozen:
    """Attributes set once in ``__init__``: a pickle's BUILD opcode cannot change them (the storage types
    are shared by every load in the process)."""

    __slots__ = ()

    def _init(self, **kw: Any) -> None:
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise pickle.UnpicklingError(f"an attempt to set {name!r} on a {type(self).__name__[1:]}")


class _StorageType(_Frozen):
    """Stand-in for a ``torch.<Type>Storage`` class named in a persistent id (not callable)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: str) -> None:
        self._init(dtype=dtype)


class _Storage(_Frozen):
    """One storage of the archive: its dtype, element count and mapped bytes."""

    __slots__ = ("dtype", "key", "numel", "raw")

    def __init__(self, dtype: str, key: str, numel: int, raw: np.ndarray) -> None:
        self._init(dtype=dtype, key=key, numel=numel, raw=raw)


class _TensorRecord(_Frozen):
    """What ``_rebuild_tensor_v2`` describes: a strided view of a storage."""

    __slots__ = ("storage", "offset", "shape", "stride")

    def __init__(self, storage: Any, offset: Any, size: Any, stride: Any) -> None:
        if not isinstance(storage, _Storage):
            raise pickle.UnpicklingError("a tensor whose storage is not a storage record")
        ints = (offset, *size, *stride) if isinstance(size, tuple) and isinstance(stride, tuple) else None
        if ints is None or not all(type(x) is int for x in ints) or len(size) != len(stride):
            raise pickle.UnpicklingError("a tensor with a malformed offset, size or stride")
        if offset < 0 or min((*size, *stride), default=0) < 0:
            raise pickle.UnpicklingError("a tensor with a negative offset, size or stride")
        if math.prod(size) > max(storage.numel, 1):  # (no broadcast views: a state dict holds none)
            raise pickle.UnpicklingError(f"a tensor of {list(size)} on a storage of {storage.numel} elements")
        self._init(storage=storage, offset=offset, shape=size, stride=stride)


def _rebuild_tensor_v2(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> _TensorRecord:
    return _TensorRecord(storage, offset, size, stride)


def _rebuild_parameter(data: Any, *_rest: Any) -> Any:
    if not isinstance(data, _TensorRecord):
        raise pickle.UnpicklingError("a parameter that is not a tensor")
    return data


_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", k): _StorageType(v) for k, v in _STORAGES.items()},
}


class _Refused(Exception):
    pass


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storages: dict[str, tuple[int, int]], buf: np.ndarray) -> None:
        super().__init__(io.BytesIO(data))
        self._storages, self._buf = storages, buf
        self._seen: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _GLOBALS[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"an unknown persistent id {str(pid)[:60]!r}")
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType) or not isinstance(key, str) or type(numel) is not int:
            raise pickle.UnpicklingError(f"a malformed storage record {str(pid)[:60]!r}")
        if key in self._seen:
            return self._seen[key]
        if key not in self._storages:
            raise pickle.UnpicklingError(f"storage {key!r} is not in the archive")
        start, n = self._storages[key]
        item = _DTYPES[stype.dtype].itemsize
        if numel < 0 or n < numel * item:
            raise pickle.UnpicklingError(f"storage {key!r} holds {n} bytes, not {numel} x {item}")
        raw = self._buf[start : start + numel * item].view(_DTYPES[stype.dtype])
        self._seen[key] = st = _Storage(stype.dtype, key, numel, raw)
        return st


class TorchTensor(SafeTensor):
    """One tensor of a ``.bin`` shard: a strided, read-only view of its mapped storage."""

    def __init__(self, name: str, rec: _TensorRecord, file: Path) -> None:
        super().__init__(name, rec.storage.dtype, tuple(rec.shape), file, np.zeros(0, np.uint8))
        self._rec = rec

    def raw(self) -> np.ndarray:
        r = self._rec
        st = r.storage.raw
        if not r.shape:
            return st[r.offset : r.offset + 1].reshape(())
        strides = tuple(s * st.itemsize for s in r.stride)
        return np.lib.stride_tricks.as_strided(st[r.offset :], r.shape, strides, writeable=False)


def _data_start(f: Any, info: zipfile.ZipInfo) -> int:
    """Where an entry's bytes begin: after its local header, whose extra field (torch pads it to
    align the data) may differ from the central directory's."""
    f.seek(info.header_offset)
    head = f.read(30)
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise ConvertError("")
    n, m = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + n + m


class TorchBinFile:
    """One ``.bin`` file, mapped; ``tensors`` in the state dict's order (as ``torch.load`` gives them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mm: mmap.mmap | None = None
        self.tensors: dict[str, SafeTensor] = {}
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                magic = f.read(4)
                if magic != b"PK\x03\x04":
                    raise ConvertError(
                        f"{path.name}: not a PyTorch zip checkpoint (the legacy torch.save format before "
                        "PyTorch 1.6 is not read: save it again with a newer torch, or as safetensors)"
                    )
                try:
                    zf = zipfile.ZipFile(f)
                except (zipfile.BadZipFile, EOFError, ValueError):
                    raise ConvertError(
                        f"{path.name} is truncated or damaged (its zip directory cannot be read; "
                        f"{size} bytes)"
                    ) from None
                with zf:
                    state, storages = self._index(zf, f, size)
                    pkl = zf.read(state)
                    bo = state.rsplit("/", 1)[0] + "/byteorder"
                    order = zf.read(bo).strip() if bo in zf.NameToInfo else b"little"
                if order != b"little":
                    raise ConvertError(f"{path.name}: a {order.decode(errors='replace')}-endian checkpoint")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            buf = np.frombuffer(self._mm, dtype=np.uint8)
        except ConvertError:
            raise
        except OSError as e:
            raise ConvertError(f"{path}: cannot read: {e.strerror or e}") from None
        except (zipfile.BadZipFile, EOFError, KeyError, ValueError):
            raise ConvertError(f"{path.name} is truncated or damaged (a zip entry cannot be read)") from None
        obj = self._unpickle(pkl, storages, buf)
        for name, rec in obj.items():
            self.tensors[name] = t = TorchTensor(name, rec, path)
            self._check(t)

    def _index(self, zf: zipfile.ZipFile, f: Any, size: int) -> tuple[str, dict[str, tuple[int, int]]]:
        pkls = [i.filename for i in zf.infolist() if i.filename.endswith("data.pkl")]
        if len(pkls) != 1 or pkls[0].count("/") != 1:
            raise ConvertError(f"{self.path.name}: not a PyTorch checkpoint (no single <archive>/data.pkl)")
        prefix = pkls[0].split("/")[0] + "/data/"
        storages: dict[str, tuple[int, int]] = {}
        for info in zf.infolist():
            if not info.filename.startswith(prefix):
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise ConvertError(f"{self.path.name}: storage {info.filename!r} is compressed")
            try:
                start = _data_start(f, info)
            except ConvertError:
                raise ConvertError(f"{self.path.name} is truncated or damaged ({info.filename!r})") from None
            if start + info.file_size > size:
                raise ConvertError(
                    f"{self.path.name} is truncated: storage {info.filename!r} ends at byte "
                    f"{start + info.file_size}, the file has {size}"
                )
            storages[info.filename[len(prefix) :]] = (start, info.file_size)
        if zf.getinfo(pkls[0]).file_size > _MAX_PICKLE:
            raise ConvertError(f"{self.path.name}: its data.pkl is too large for a state dict")
        return pkls[0], storages

    def _unpickle(self, pkl: bytes, storages: dict[str, tuple[int, int]], buf: np.ndarray) -> dict:
        try:
            obj = _Unpickler(pkl, storages, buf).load()
        except _Refused as e:
            raise ConvertError(
                f"{self.path.name}: refusing to unpickle a call to {e} (only tensors, their storages and "
                "OrderedDict are allowed; nothing in the file was run)"
            ) from None
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError,
                KeyError, struct.error, RecursionError, MemoryError) as e:  # fmt: skip
            raise ConvertError(f"{self.path.name}: not a readable state dict ({e})") from None
        if not isinstance(obj, dict):
            raise ConvertError(f"{self.path.name}: holds a {type(obj).__name__}, not a state dict")
        for k, v in obj.items():
            if not isinstance(k, str) or not isinstance(v, _TensorRecord):
                raise ConvertError(f"{self.path.name}: entry {str(k)[:80]!r} is not a tensor")
        return obj

    def _check(self, t: TorchTensor) -> None:
        r = t._rec
        if all(r.shape):
            last = r.offset + sum((n - 1) * s for n, s in zip(r.shape, r.stride, strict=True))
            if last >= r.storage.numel:
                raise ConvertError(
                    f"{self.path.name}: tensor {t.name!r}{list(r.shape)} reaches element {last} of a "
                    f"storage of {r.storage.numel}"
                )

    def close(self) -> None:
        self.tensors = {}
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # views still alive: the mapping goes with them
                pass
            self._mm = None
