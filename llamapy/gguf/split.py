"""Split models: ``PREFIX-00001-of-00003.gguf`` … as one model, and splitting / merging files.

Naming and keys follow llama.cpp's gguf-split: the first file holds all metadata; every file holds
``split.no`` (UINT16, 0-based), ``split.count`` (UINT16) and ``split.tensors.count`` (INT32, the total
over all files). A file without ``split.count`` (or with 0 or 1) is a whole model by itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .constants import (
    GGUF_DEFAULT_ALIGNMENT,
    KEY_ALIGNMENT,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    GGUFValueType,
)
from .reader import GGUFError, GGUFField, GGUFReader, TensorInfo

if TYPE_CHECKING:
    from .writer import GGUFWriter

SPLIT_KEYS = (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT)
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_INT_TYPES = {
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16, GGUFValueType.UINT32,
    GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
}  # fmt: skip


def split_path(prefix: str | os.PathLike, split_no: int, split_count: int) -> str:
    """llama.cpp's ``llama_split_path``: ``PREFIX-{split_no+1:05d}-of-{split_count:05d}.gguf`` (0-based no)."""
    return f"{os.fspath(prefix)}-{split_no + 1:05d}-of-{split_count:05d}.gguf"


def split_prefix(path: str | os.PathLike, split_no: int, split_count: int) -> str | None:
    """The prefix of a split file name when it matches ``split_no``/``split_count``, else None."""
    m = _SPLIT_NAME.match(os.fspath(path))
    if m is None or int(m["no"]) != split_no + 1 or int(m["count"]) != split_count:
        return None
    return m["prefix"]


def _int_key(r: GGUFReader, key: str) -> int | None:
    f = r.fields.get(key)
    if f is None:
        return None
    if f.type not in _INT_TYPES:
        raise GGUFError(f"{r.path}: {key} at offset {f.offset} has type {f.type.name}, expected an integer")
    return int(f.value)


class GGUFModelFiles:
    """One model over one or more GGUF files: the first file's metadata, all files' tensors."""

    def __init__(self, readers: list[GGUFReader]) -> None:
        self.readers = readers
        index: dict[str, TensorInfo] = {}
        owner: dict[str, str] = {}
        for r in readers:
            for t in r.tensors:
                if t.name in index:
                    raise GGUFError(
                        f"{r.path}: tensor {t.name!r} at offset {t.offset} is also in {owner[t.name]}"
                    )
                index[t.name] = t
                owner[t.name] = r.path
        self.tensor_index: dict[str, TensorInfo] = index
        self.tensors: list[TensorInfo] = list(index.values())

    @property
    def path(self) -> str:
        return self.readers[0].path

    @property
    def paths(self) -> list[str]:
        return [r.path for r in self.readers]

    @property
    def n_split(self) -> int:
        return len(self.readers)

    @property
    def fields(self) -> dict[str, GGUFField]:
        return self.readers[0].fields

    @property
    def metadata(self) -> dict[str, Any]:
        return self.readers[0].metadata

    @property
    def version(self) -> int:
        return self.readers[0].version

    @property
    def alignment(self) -> int:
        return self.readers[0].alignment

    @property
    def file_size(self) -> int:
        """Bytes over all files."""
        return sum(r.file_size for r in self.readers)

    def get(self, key: str, default: Any = None) -> Any:
        return self.readers[0].get(key, default)

    def raw_value(self, key: str) -> bytes:
        return self.readers[0].raw_value(key)

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors)

    def close(self) -> None:
        for r in self.readers:
            r.close()
        self.tensors = []
        self.tensor_index = {}

    def __enter__(self) -> GGUFModelFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_model(path: str | os.PathLike, mmap: bool = True) -> GGUFModelFiles:
    """Open a model: a single GGUF file, or the first file of a split (the others are found by name)."""
    first = GGUFReader(path, mmap=mmap)
    readers = [first]
    try:
        n = _int_key(first, KEY_SPLIT_COUNT)
        no = _int_key(first, KEY_SPLIT_NO)
        if n is None or n in (0, 1):
            if n == 1 and no not in (None, 0):
                raise GGUFError(f"{first.path}: {KEY_SPLIT_NO} = {no} but {KEY_SPLIT_COUNT} = 1")
            return GGUFModelFiles(readers)
        if n < 0 or n > 99999:
            raise GGUFError(f"{first.path}: {KEY_SPLIT_COUNT} = {n} is out of range")
        if no is None:
            raise GGUFError(f"{first.path}: {KEY_SPLIT_COUNT} = {n} but there is no {KEY_SPLIT_NO} key")
        if no != 0:
            raise GGUFError(
                f"{first.path}: this is split {no + 1} of {n}; open the first split (…-00001-of-{n:05d}.gguf)"
            )
        prefix = split_prefix(first.path, 0, n)
        if prefix is None:
            raise GGUFError(
                f"{first.path}: {KEY_SPLIT_COUNT} = {n}, but the name does not end in -00001-of-{n:05d}.gguf"
            )
        total = _int_key(first, KEY_SPLIT_TENSORS_COUNT)
        for i in range(1, n):
            p = split_path(prefix, i, n)
            if not os.path.exists(p):
                raise GGUFError(f"{first.path}: split {i + 1} of {n} is missing: {p}")
            r = GGUFReader(p, mmap=mmap)
            readers.append(r)
            for key, want in ((KEY_SPLIT_NO, i), (KEY_SPLIT_COUNT, n)):
                got = _int_key(r, key)
                if got != want:
                    raise GGUFError(f"{p}: {key} is {got}, expected {want}")
            t = _int_key(r, KEY_SPLIT_TENSORS_COUNT)
            if t is not None and total is not None and t != total:
                raise GGUFError(f"{p}: {KEY_SPLIT_TENSORS_COUNT} is {t}, but the first split says {total}")
        model = GGUFModelFiles(readers)
        if total is not None and len(model.tensors) != total:
            raise GGUFError(
                f"{first.path}: {KEY_SPLIT_TENSORS_COUNT} = {total}, but the {n} splits hold {len(model.tensors)} tensors"
            )
        return model
    except BaseException:
        for r in readers:
            r.close()
        raise


# -- writing splits ------------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """``"500M"`` / ``"2G"`` -> bytes (decimal units, as llama.cpp's gguf-split); plain digits are bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, re.IGNORECASE)
    if m is None or int(m[1]) <= 0:
        raise GGUFError(
            f"bad size {text!r}: expected a positive number with an optional unit K, M or G (e.g. 500M)"
        )
    return int(m[1]) * {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3}[m[2].upper()]


def plan_splits(
    tensors: list[TensorInfo], max_tensors: int | None = None, max_size: int | None = None
) -> list[list[TensorInfo]]:
    """Group tensors (in order) like gguf-split: at most ``max_tensors`` per file, or at most ``max_size``
    bytes of tensor data (each tensor padded to 32) per file; a tensor bigger than the limit goes alone."""
    if (max_tensors is None) == (max_size is None):
        raise GGUFError("give exactly one of max_tensors and max_size")
    if max_tensors is not None and max_tensors < 1:
        raise GGUFError(f"max_tensors must be at least 1, got {max_tensors}")
    if max_size is not None and max_size < 1:
        raise GGUFError(f"max_size must be positive, got {max_size}")
    groups: list[list[TensorInfo]] = [[]]
    size = 0
    for i, t in enumerate(tensors):
        nb = t.nbytes + (-t.nbytes % GGUF_DEFAULT_ALIGNMENT)
        if max_tensors is not None:
            new = i > 0 and i % max_tensors == 0
        else:
            new = bool(groups[-1]) and size + nb > max_size  # type: ignore[operator]
        if new:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += nb
    return groups


def _copy_metadata(w: GGUFWriter, src: GGUFModelFiles | GGUFReader, skip: tuple[str, ...]) -> None:
    for key, f in src.fields.items():
        if key not in skip:
            w.add_key_value_raw(key, f.type, src.raw_value(key))


def _write_tensors(w: GGUFWriter, tensors: list[TensorInfo]) -> None:
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, t.ggml_type, t.nbytes)
    for t in tensors:
        w.write_tensor_data(t.data, name=t.name)  # zero-copy view of the source map: streamed, not held


def split_model(
    path: str | os.PathLike,
    out_prefix: str | os.PathLike,
    max_tensors: int | None = None,
    max_size: int | None = None,
    dry_run: bool = False,
) -> list[tuple[str, list[TensorInfo]]]:
    """Split one GGUF file into ``out_prefix-0000i-of-0000n.gguf``; returns the plan (path, tensors)."""
    with open_model(path) as src:
        if src.n_split > 1 or src.get(KEY_SPLIT_COUNT, 0) > 1:
            raise GGUFError(f"{src.path}: already split into {src.n_split} files; merge it first")
        groups = plan_splits(src.tensors, max_tensors, max_size)
        n = len(groups)
        if n > 65535:
            raise GGUFError(f"{src.path}: {n} splits is more than {KEY_SPLIT_COUNT} (UINT16) can hold")
        plan = [(split_path(out_prefix, i, n), g) for i, g in enumerate(groups)]
        if dry_run:
            return plan
        from .writer import GGUFWriter  # here: reading a model needs no writer

        align = src.alignment
        for i, (p, group) in enumerate(plan):
            tmp = p + ".tmp"
            w = GGUFWriter(tmp, alignment=GGUF_DEFAULT_ALIGNMENT)
            if i == 0:
                _copy_metadata(w, src, SPLIT_KEYS)
            elif align != GGUF_DEFAULT_ALIGNMENT:
                w.add_key_value(KEY_ALIGNMENT, align, GGUFValueType.UINT32)
            w.add_key_value(KEY_SPLIT_NO, i, GGUFValueType.UINT16)
            w.add_key_value(KEY_SPLIT_COUNT, n, GGUFValueType.UINT16)
            w.add_key_value(KEY_SPLIT_TENSORS_COUNT, len(src.tensors), GGUFValueType.INT32)
            _write_into(w, tmp, p, group)
        return plan


def merge_model(first_split: str | os.PathLike, out: str | os.PathLike) -> list[str]:
    """Merge the splits starting at ``first_split`` into one file ``out`` (without the split.* keys);
    returns the paths of the splits read."""
    out = os.fspath(out)
    if os.path.exists(out):
        raise GGUFError(f"{out}: output file already exists")
    with open_model(first_split) as src:
        if src.get(KEY_SPLIT_COUNT) is None:
            raise GGUFError(f"{src.path}: not a split model (no {KEY_SPLIT_COUNT} key)")
        from .writer import GGUFWriter

        w = GGUFWriter(out + ".tmp")
        _copy_metadata(w, src, SPLIT_KEYS)
        _write_into(w, out + ".tmp", out, src.tensors)
        return src.paths


def _write_into(w: GGUFWriter, tmp: str, final: str, tensors: list[TensorInfo]) -> None:
    """Write the tensors through ``w`` into ``tmp``, then rename to ``final`` (no half-written outputs)."""
    try:
        _write_tensors(w, tensors)
        w.write()
        os.replace(tmp, final)
    except BaseException:
        w.abort()
        Path(tmp).unlink(missing_ok=True)
        raise
