"""A GGUF array of strings kept as its encoded bytes: one blob and an offset per element.

A vocabulary's ``tokenizer.ggml.tokens`` (262,144 strings for Gemma 3) and ``tokenizer.ggml.merges`` as
Python lists cost 60-90 bytes a string and most of a model's load time. :class:`StringArray` holds the
array exactly as the file encodes it (for each element a little-endian u64 length, then its UTF-8
bytes) and decodes an element when it is asked for, so a reader only scans the lengths. It is a
read-only ``Sequence[str]`` (indexing, slices as lists, iteration, ``in``, ``==`` with lists), and gives
the raw form to code that works on bytes (a tokenizer's hash table, the GGUF writer: an exact copy).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

_LEN = struct.Struct("<Q")


class StringArray(Sequence[str]):
    """``n`` strings over ``raw`` (their GGUF encoding); ``offsets[i]`` is where element ``i``'s length
    field starts, ``offsets[n] == len(raw)``. Strings decode as UTF-8 with ``surrogateescape`` (any
    bytes round-trip), as the reader always did."""

    __slots__ = ("_off", "_raw")

    def __init__(self, raw: bytes, offsets: np.ndarray) -> None:
        self._raw = bytes(raw)
        self._off = np.ascontiguousarray(offsets, dtype=np.int64)
        if self._off.ndim != 1 or self._off.size < 1 or int(self._off[-1]) != len(self._raw):
            raise ValueError("StringArray: offsets must end at the length of the data")

    @classmethod
    def from_strings(cls, items: Sequence[str | bytes]) -> StringArray:
        parts = [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s) for s in items]
        raw = b"".join(_LEN.pack(len(p)) + p for p in parts)
        lens = np.fromiter((len(p) + 8 for p in parts), dtype=np.int64, count=len(parts))
        off = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        return cls(raw, off)

    # -- Sequence ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._off.size - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = self._off.size - 1
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"string index {i} out of range ({n} strings)")
        off = self._off
        return self._raw[int(off[j]) + 8 : int(off[j + 1])].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        raw = self._raw
        bounds = self._off.tolist()
        for a, b in zip(bounds, bounds[1:]):  # noqa: B905 - bounds[1:] is one shorter by design
            yield raw[a + 8 : b].decode("utf-8", "surrogateescape")

    def __reversed__(self) -> Iterator[str]:
        return reversed(self.tolist())

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.index_of(text) >= 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self._raw == other._raw
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))  # noqa: B905
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"

    # -- compact access ---------------------------------------------------------------------------
    def tolist(self) -> list[str]:
        """All strings, decoded in one call: each 8-byte length field becomes one 0xFF byte (never
        part of UTF-8, so no sequence runs across it and every string decodes exactly as alone) and
        the decoded text is split there. Data holding 0xFF bytes itself decodes string by string."""
        n = len(self)
        if n < 64:
            return list(self)
        u8 = np.frombuffer(self._raw, dtype=np.uint8)
        keep = np.ones(u8.size, dtype=bool)
        keep[(self._off[:-1, None] + np.arange(1, 8)).ravel()] = False
        buf = u8.copy()
        buf[self._off[:-1]] = 0xFF
        joined = buf[keep].tobytes()
        if joined.count(b"\xff") != n:
            return list(self)
        return joined.decode("utf-8", "surrogateescape").split("\udcff")[1:]

    def index_of(self, text: str) -> int:
        """The first index whose string is ``text``, else -1 (a search of the blob; no dict)."""
        enc = text.encode("utf-8", "surrogateescape")
        pat = _LEN.pack(len(enc)) + enc
        raw, off = self._raw, self._off
        pos = raw.find(pat)
        while pos >= 0:
            k = int(np.searchsorted(off, pos))
            if k < off.size - 1 and int(off[k]) == pos:
                return k
            pos = raw.find(pat, pos + 1)
        return -1

    @property
    def raw(self) -> bytes:
        """The elements as the GGUF file encodes them (without the array's type and count)."""
        return self._raw

    @property
    def offsets(self) -> np.ndarray:
        return self._off

    def blob(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(uint8 view of the data, start of each string's bytes, their lengths)."""
        starts = self._off[:-1] + 8
        lens = self._off[1:] - starts
        return np.frombuffer(self._raw, dtype=np.uint8), starts, lens

    def byte_lengths(self) -> np.ndarray:
        return self._off[1:] - self._off[:-1] - 8

    @property
    def nbytes(self) -> int:
        return len(self._raw) + self._off.nbytes


def _scan_vectorized(buf: Any, pos: int, size: int, n: int) -> StringArray | None:
    """:func:`scan_strings` in NumPy for arrays of mostly short strings: a string starts where the 8 bytes
    read as a u64 are below 256. Candidates are taken in order while each one's length leads to the next
    (so each taken start is proven by the one before it); where the chain breaks (a string of 256 bytes
    or more, an empty one, content that looks like a length) the scan goes on from the last proven end.
    Tokenizer arrays of 50-260k strings: 2-10 ms instead of 25-100 ms. None (a string past the end of
    the data, or too many breaks): the loop decides."""
    avail = size - pos
    parts: list[np.ndarray] = []
    cur, left = 0, n
    for _ in range(16):
        if left == 0:
            break
        window = min(avail - cur, 24 * left + 64)
        if window < 8:
            return None
        data = np.frombuffer(buf, dtype=np.uint8, count=window, offset=pos + cur)
        lens = np.ndarray((window - 7,), dtype="<u8", buffer=data, strides=(1,))
        first = int(lens[0])
        if first >= 256:  # a long string here: step over it
            if first > avail - cur - 8:
                return None
            parts.append(np.array([cur], dtype=np.int64))
            cur, left = cur + 8 + first, left - 1
            continue
        starts = np.flatnonzero(lens < 256)[:left]  # starts[0] == 0: this place is a proven start
        ends = starts + 8 + lens[starts].astype(np.int64)
        bad = np.flatnonzero(ends[:-1] != starts[1:])
        k = int(bad[0]) if bad.size else starts.size - 1  # starts[:k + 1] are proven; ends[k] is the next
        if int(ends[k]) > avail - cur:
            return None
        parts.append(starts[: k + 1] + cur)
        cur, left = cur + int(ends[k]), left - (k + 1)
    if left:
        return None
    offs = np.concatenate([*parts, np.array([cur], dtype=np.int64)])
    return StringArray(bytes(buf[pos : pos + cur]), offs)


def scan_strings(buf: Any, pos: int, size: int, n: int, what: str, error: type[Exception]) -> StringArray:
    """Read ``n`` GGUF strings from ``buf`` at ``pos`` (lengths are checked against ``size``, the end
    of the data) without decoding them; ``error`` is raised with ``what[i]`` and the offset."""
    import array

    if n >= 256:
        fast = _scan_vectorized(buf, pos, size, n)
        if fast is not None:
            return fast

    offs = array.array("q")
    add = offs.append
    unpack = _LEN.unpack_from
    start = pos
    for i in range(n):
        if pos + 8 > size:
            raise error(f"{what}[{i}] at offset {pos}: string length past the end of the file")
        ln = unpack(buf, pos)[0]
        if ln > size - pos - 8:
            raise error(f"{what}[{i}] at offset {pos}: string of {ln} bytes runs past the end of the file")
        add(pos - start)
        pos += 8 + ln
    add(pos - start)
    return StringArray(bytes(buf[start:pos]), np.frombuffer(offs, dtype=np.int64))
