"""Importance-matrix files as llama.cpp's ``llama-imatrix`` writes them, read and written.

- GGUF (the current format): ``general.type = "imatrix"``, ``imatrix.datasets`` (string array),
  ``imatrix.chunk_count`` and ``imatrix.chunk_size`` (UINT32), and per weight two F32 tensors:
  ``<name>.in_sum2`` ``[n_mat, ne0]`` (raw sums of squared activations) and ``<name>.counts`` ``[n_mat, 1]``
  (how many activation rows went into each; per expert for MoE weights).
- legacy ``.dat``: int32 entry count; per entry int32 name length, name, int32 ncall, int32 nval, nval
  float32 values ``(sum / count) * ncall``; then optionally int32 chunk count, int32 length and the dataset.
"""

from __future__ import annotations

import os
import struct
from dataclasses import field

import numpy as np

from .._dataclass import dataclass
from ..gguf.constants import GGUFValueType
from ..gguf.reader import GGUFError, GGUFReader
from ..gguf.writer import GGUFWriter
from .ftypes import QuantizeError

__all__ = ["Imatrix", "ImatrixEntry", "load_imatrix", "save_imatrix", "save_imatrix_legacy"]


@dataclass
class ImatrixEntry:
    sums: np.ndarray  # float32[n_mat * ne0]
    counts: np.ndarray  # int64[n_mat] (one count for a dense weight)


@dataclass
class Imatrix:
    entries: dict[str, ImatrixEntry] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False
    has_metadata: bool = True

    def weights(self) -> dict[str, np.ndarray]:
        """Per weight the importance llama-quantize uses: sums / count per matrix (1 where no data)."""
        out: dict[str, np.ndarray] = {}
        for name, e in self.entries.items():
            sums = e.sums.astype(np.float32)
            if self.is_legacy:  # values hold (sum/count)*ncall
                ncall = int(e.counts[0]) if len(e.counts) else 0
                out[name] = sums / np.float32(ncall) if ncall > 0 else sums
                continue
            n = len(e.counts)
            per = sums.reshape(n, -1).copy()
            for j, c in enumerate(e.counts):
                per[j] = per[j] / np.float32(c) if c > 0 else np.float32(1)
            out[name] = per.reshape(-1)
        return out

    def merge(self, other: Imatrix, chunk_size: int) -> None:
        """Add ``other`` into this one as llama-imatrix's ``--in-file`` does (legacy values are turned
        back into raw sums with ``chunk_size``)."""
        for name, oe in other.entries.items():
            if other.is_legacy:
                sums = oe.sums.astype(np.float32) * np.float32(chunk_size)
                counts = np.full(1, int(oe.counts[0]) * chunk_size, dtype=np.int64)
            else:
                sums, counts = oe.sums.astype(np.float32), oe.counts.astype(np.int64)
            e = self.entries.get(name)
            if e is None:
                self.entries[name] = ImatrixEntry(sums.copy(), counts.copy())
                continue
            if e.sums.shape != sums.shape:
                raise QuantizeError(f"imatrix entry {name}: {len(sums)} values, {len(e.sums)} before")
            if len(e.counts) == 1 and len(counts) > 1:
                e.counts = np.full(len(counts), e.counts[0], dtype=np.int64)
            elif len(e.counts) != len(counts) and not (other.is_legacy and len(counts) == 1):
                raise QuantizeError(f"imatrix entry {name}: {len(counts)} counts, {len(e.counts)} before")
            e.sums = e.sums + sums
            e.counts = e.counts + counts
        self.datasets += other.datasets
        if chunk_size > 0:
            mx = max((int(c) for e in self.entries.values() for c in e.counts), default=0)
            self.chunk_count = mx // chunk_size


def load_imatrix(path: str | os.PathLike) -> Imatrix:
    """Read an imatrix in the GGUF format or, when the file is not GGUF, the legacy ``.dat`` one."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise QuantizeError(f"{path}: cannot read the imatrix: {e.strerror or e}") from None
    if magic == b"GGUF":
        return _load_gguf(path)
    return _load_legacy(path)


def _load_gguf(path: str) -> Imatrix:
    try:
        r = GGUFReader(path)
    except GGUFError as e:
        raise QuantizeError(f"imatrix: {e}") from None
    with r:
        if not r.tensors:
            raise QuantizeError(f"{path}: no data in the imatrix file")
        im = Imatrix()
        ds = r.fields.get("imatrix.datasets")
        if ds is not None and ds.type == GGUFValueType.ARRAY and ds.sub_type == GGUFValueType.STRING:
            im.datasets = [str(x) for x in ds.value]
        im.has_metadata = all(
            k in r.fields for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
        )
        im.chunk_count = int(r.get("imatrix.chunk_count", 0))
        im.chunk_size = int(r.get("imatrix.chunk_size", 0))
        pairs: dict[str, dict[str, np.ndarray]] = {}
        for t in r.tensors:
            for suf in (".in_sum2", ".counts"):
                if t.name.endswith(suf) and len(t.name) > len(suf):
                    if t.ggml_type.name != "F32":
                        raise QuantizeError(f"{path}: sums and counts for {t.name} must be F32")
                    pairs.setdefault(t.name[: -len(suf)], {})[suf] = np.array(
                        t.array(), dtype=np.float32
                    ).reshape(-1)
        for name in sorted(pairs):
            p = pairs[name]
            if len(p) != 2:
                raise QuantizeError(f"{path}: mismatched sums and counts for {name}")
            counts = np.round(p[".counts"]).astype(np.int64)  # lround
            if len(counts) == 0 or len(p[".in_sum2"]) % len(counts):
                raise QuantizeError(
                    f"{path}: {name}: {len(p['.in_sum2'])} sums do not split into {len(counts)} matrices"
                )
            im.entries[name] = ImatrixEntry(p[".in_sum2"], counts)
    return im


def _load_legacy(path: str) -> Imatrix:
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt: str, what: str) -> tuple:
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > len(data):
            raise QuantizeError(f"{path}: not an imatrix file (GGUF or legacy .dat): truncated at {what}")
        v = struct.unpack_from(fmt, data, pos)
        pos += n
        return v

    (n_entries,) = take("<i", "the entry count")
    if n_entries < 1:
        raise QuantizeError(f"{path}: not an imatrix file (GGUF or legacy .dat): no entries")
    im = Imatrix(is_legacy=True)
    for i in range(n_entries):
        (ln,) = take("<i", f"entry {i + 1}")
        if not 0 < ln <= 4096 or pos + ln > len(data):
            raise QuantizeError(f"{path}: not an imatrix file: bad name length {ln} for entry {i + 1}")
        name = data[pos : pos + ln].decode("utf-8", errors="replace")
        pos += ln
        ncall, nval = take("<ii", f"entry {name}")
        if nval < 1 or pos + 4 * nval > len(data):
            raise QuantizeError(f"{path}: entry {name}: bad number of values {nval}")
        sums = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        im.entries[name] = ImatrixEntry(sums, np.array([ncall], dtype=np.int64))
    if pos + 4 <= len(data):
        (im.chunk_count,) = take("<i", "the chunk count")
        if pos + 4 <= len(data):
            (ln,) = take("<i", "the dataset")
            if 0 < ln and pos + ln <= len(data):
                im.datasets.append(data[pos : pos + ln].decode("utf-8", errors="replace"))
    return im


def _tmp(path: str) -> str:
    return f"{path}.tmp.{os.getpid()}"


def save_imatrix(im: Imatrix, path: str | os.PathLike) -> None:
    """Write ``im`` in llama-imatrix's GGUF format (entries sorted by name), through a temporary file."""
    path = os.fspath(path)
    tmp = _tmp(path)
    w = GGUFWriter(tmp)
    try:
        w.add_key_value("general.type", "imatrix", GGUFValueType.STRING)
        w.add_key_value("imatrix.datasets", list(im.datasets), GGUFValueType.ARRAY, GGUFValueType.STRING)
        w.add_key_value("imatrix.chunk_count", int(im.chunk_count), GGUFValueType.UINT32)
        w.add_key_value("imatrix.chunk_size", int(im.chunk_size), GGUFValueType.UINT32)
        for name in sorted(im.entries):
            e = im.entries[name]
            nmat = len(e.counts)
            if not len(e.sums) or not nmat:
                continue
            # ggml drops trailing dimensions of 1: a dense weight's entry is 1-D, as llama-imatrix writes it
            sums = np.asarray(e.sums, dtype=np.float32).reshape(nmat, -1)
            counts = np.asarray(e.counts, dtype=np.float32).reshape(nmat, 1)
            w.add_tensor(f"{name}.in_sum2", sums if nmat > 1 else sums.reshape(-1))
            w.add_tensor(f"{name}.counts", counts if nmat > 1 else counts.reshape(-1))
        w.write()
        os.replace(tmp, path)
    except BaseException:
        w.abort()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_imatrix_legacy(im: Imatrix, path: str | os.PathLike, dataset: str = "") -> None:
    """Write ``im`` in the legacy ``.dat`` format (entries without any data are left out)."""
    path = os.fspath(path)
    cs = max(1, im.chunk_size)
    parts: list[bytes] = []
    names = [n for n in sorted(im.entries) if (im.entries[n].counts > 0).any()]
    parts.append(struct.pack("<i", len(names)))
    for name in names:
        e = im.entries[name]
        b = name.encode()
        ncall = (int(e.counts.max()) + cs - 1) // cs
        nmat = len(e.counts)
        per = np.asarray(e.sums, dtype=np.float32).reshape(nmat, -1).copy()
        for j, c in enumerate(e.counts):
            per[j] = (per[j] / np.float32(c) if c > 0 else np.float32(1)) * np.float32(ncall)
        parts += [
            struct.pack("<i", len(b)),
            b,
            struct.pack("<ii", ncall, per.size),
            per.astype("<f4").tobytes(),
        ]
    ds = (dataset or (im.datasets[-1] if im.datasets else "")).encode()
    parts += [struct.pack("<ii", im.chunk_count, len(ds)), ds]
    tmp = _tmp(path)
    try:
        with open(tmp, "wb") as f:
            f.write(b"".join(parts))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
