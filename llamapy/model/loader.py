"""The model loader: one tensor index over one or more GGUF files (splits), typed metadata access,
tensor checks (presence, shape, type) and the load modes mmap / read / mlock.

Weights are never converted: a tensor keeps its GGUF type, and with mmap its bytes stay in the
page cache (the ggml weight is a zero-copy view of the mapped file).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..ggml.types import TRAITS, GGMLType
from ..gguf import GGUFError, GGUFReader, TensorInfo
from ..gguf.overrides import KVOverride, apply_kv_overrides
from .hparams import MetaReader, ModelLoadError

ProgressCallback = Callable[[float], Any]


def _open(path: str, use_mmap: bool) -> Any:
    try:
        from ..gguf.split import open_model  # splits (several files) when the gguf layer has them
    except ImportError:
        open_model = None
    if open_model is not None:
        return open_model(path, mmap=use_mmap)
    return GGUFReader(path, mmap=use_mmap)


def _mlock(arr: np.ndarray) -> bool:
    """Lock the pages of ``arr`` in memory; False (with a warning) when the OS refuses."""
    if sys.platform.startswith("win"):
        return False
    import ctypes
    import ctypes.util  # here: its import (2-4 ms) is for --mlock only

    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    addr = arr.__array_interface__["data"][0]
    page = os.sysconf("SC_PAGE_SIZE")
    start = addr - addr % page
    if libc.mlock(ctypes.c_void_p(start), ctypes.c_size_t(arr.nbytes + addr - start)) != 0:
        err = ctypes.get_errno()
        warnings.warn(
            f"mlock of {arr.nbytes} bytes failed: {os.strerror(err)} (try raising RLIMIT_MEMLOCK)",
            stacklevel=3,
        )
        return False
    return True


class ModelLoader:
    """Opens a model file (or the first of its splits) and hands out checked tensors."""

    def __init__(
        self,
        path: str | os.PathLike,
        use_mmap: bool = True,
        use_mlock: bool = False,
        kv_overrides: Sequence[KVOverride] = (),
    ) -> None:
        """``kv_overrides`` (llama.cpp's ``--override-kv``) replace or add metadata values before
        anything reads them (:mod:`llamapy.gguf.overrides`)."""
        self.path = os.fspath(path)
        self.use_mmap = use_mmap
        self.use_mlock = use_mlock
        if not os.path.exists(self.path):
            raise ModelLoadError(f"{self.path}: model file not found")
        try:
            self.files = _open(self.path, use_mmap)
        except GGUFError as e:
            raise ModelLoadError(f"cannot load model: {e}") from e
        self.metadata: dict[str, Any] = dict(self.files.metadata)
        if kv_overrides:
            try:
                apply_kv_overrides(self.metadata, kv_overrides, where=self.path)
            except Exception:
                self.files.close()
                raise
        self.tensor_index: dict[str, TensorInfo] = dict(self.files.tensor_index)
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelLoadError(
                f"{self.path}: metadata key 'general.architecture' is missing or not a string"
            )
        self.arch = arch
        self.used: set[str] = set()

    def meta(self) -> MetaReader:
        return MetaReader(self.metadata, self.arch, where=self.path)

    @property
    def n_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensor_index.values())

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensor_index.values())

    def has(self, name: str) -> bool:
        return name in self.tensor_index

    def check(
        self,
        name: str,
        shape: Iterable[int] | None,
        required: bool = True,
        types: Iterable[GGMLType] | None = None,
    ) -> TensorInfo | None:
        """The tensor ``name`` after checking its shape (NumPy order) and type; None if optional and absent."""
        info = self.tensor_index.get(name)
        if info is None:
            if required:
                raise ModelLoadError(f"{self.path}: tensor {name!r} is missing (architecture {self.arch})")
            return None
        if shape is not None:
            want = tuple(int(s) for s in shape)
            got = tuple(info.shape)
            # ggml drops trailing unit dims; compare after stripping leading 1s
            while len(got) < len(want) and want[0] == 1:
                want = want[1:]
            while len(want) < len(got) and got[0] == 1:
                got = got[1:]
            if got != want:
                raise ModelLoadError(
                    f"{self.path}: tensor {name!r} has wrong shape {tuple(info.shape)}; expected {tuple(shape)}"
                )
        if types is not None and info.ggml_type not in tuple(types):
            raise ModelLoadError(
                f"{self.path}: tensor {name!r} has type {info.ggml_type.name}, not supported here"
            )
        if info.ggml_type not in TRAITS:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has unsupported type {info.ggml_type!r}")
        self.used.add(name)
        return info

    def check_all_used(self) -> None:
        unused = sorted(set(self.tensor_index) - self.used)
        if unused:
            more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
            raise ModelLoadError(
                f"{self.path}: {len(unused)} tensors are not used by architecture {self.arch!r}: "
                f"{', '.join(unused[:5])}{more}"
            )

    def finish(self, progress_callback: ProgressCallback | None = None) -> None:
        """Report progress over the used tensors (in read mode the bytes are already in memory; with
        mlock, lock them); a callback returning False cancels the load."""
        infos = [self.tensor_index[n] for n in sorted(self.used, key=lambda n: self.tensor_index[n].offset)]
        total = sum(t.nbytes for t in infos) or 1
        done = 0
        locked = True
        for info in infos:
            if self.use_mlock and locked:
                locked = _mlock(info.data)
            done += info.nbytes
            if progress_callback is not None and progress_callback(done / total) is False:
                raise ModelLoadError(f"{self.path}: loading was cancelled by the progress callback")
        if progress_callback is not None and not infos and progress_callback(1.0) is False:
            raise ModelLoadError(f"{self.path}: loading was cancelled by the progress callback")
