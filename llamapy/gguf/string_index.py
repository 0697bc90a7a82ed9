"""Text -> position over a :class:`~llamapy.gguf.strings.StringArray`, without first decoding it.

A vocabulary's ``token -> id`` map and a BPE vocabulary's ``merge -> rank`` map are dicts of every
string of a GGUF array: decoding the array and filling the dict costs 20-25 ms for SmolLM2's 49k tokens
and 49k merges, 60-90 ms for a 151k vocabulary, at every model load. A short prompt then asks it a few
dozen times (the loader's special-token texts, the prompt's words). :class:`StringIndex` answers the
first lookups from the array's encoded bytes, through a sorted key per string (its byte length and last
eight bytes: one gather of ``n`` integers, ~1 ms for 49k strings; the first ``SCAN_LOOKUPS`` lookups
compare all of them, ~12 us each, and only later ones sort them, ~2.3 ms), and builds the dict only once
it has been asked more than ``budget`` times, iterated or sized: a long prompt then pays about what it
paid before, a short one never builds it.
"""

from __future__ import annotations

import struct
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any

import numpy as np

from .strings import StringArray

_MISSING: Any = object()
_LEN = struct.Struct("<Q")
_MIX = 0x9E3779B97F4A7C15  # odd: the length, spread over all 64 bits of the key
_U64 = (1 << 64) - 1

#: lookups answered from the bytes before the dict is built (each ~3 us; the dict costs about 5000 of them)
BUDGET = 1024
#: of those, the first ones compare every key (~12 us for 49k strings) rather than sort the keys (~2.3 ms):
#: a short prompt's BPE merges and the loader's special tokens ask a few dozen times
SCAN_LOOKUPS = 64


def positions(texts: Sequence[str], *, last: bool = True) -> dict[str, int]:
    """``texts``' positions by text: a repeated text maps to its last position (``last``) or its first."""
    n = len(texts)
    if last:
        return dict(zip(texts, range(n), strict=True))
    return dict(zip(reversed(texts), range(n - 1, -1, -1), strict=True))


class StringIndex(Mapping[str, int]):
    """``strings``' positions by text, as ``dict(zip(strings, range(n)))`` (``last=True``: a repeated
    text maps to its last position) or its first position (``last=False``, a BPE merge's rank)."""

    def __init__(self, strings: StringArray, *, last: bool = True, budget: int | None = None) -> None:
        self._s = strings
        self._last = last
        self._left = BUDGET if budget is None else budget
        # the sorted keys (length, last eight bytes) and the positions they came from, one attribute so
        # that a lookup reads both at once (the index may be shared by threads, and dropped once built)
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        self._keys: np.ndarray | None = None  # the keys unsorted, for the first lookups (``SCAN_LOOKUPS``)
        self._scans = 0
        self._dict: dict[str, int] | None = None

    # -- the dict ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, int]:
        """The whole map (built once; later lookups are the dict's own)."""
        d = self._dict
        if d is None:
            d = positions(self._s.tolist(), last=self._last)
            self._dict = d
            self._sorted = self._keys = None
            self.get = d.get  # type: ignore[method-assign]  # from now on the dict's lookup, at C speed
        return d

    @property
    def built(self) -> bool:
        return self._dict is not None

    # -- lookups from the bytes ----------------------------------------------------------------------
    def _unsorted(self) -> np.ndarray:
        key = self._keys
        if key is None:
            u8, starts, lens = self._s.blob()
            ends = starts + lens  # every string has its 8-byte length field before it: ends - 8 >= 0
            last8 = np.lib.stride_tricks.as_strided(u8, shape=(max(u8.size - 7, 0), 8), strides=(1, 1))
            key = last8[ends - 8].view("<u8").ravel() ^ (lens.astype(np.uint64) * np.uint64(_MIX))
            self._keys = key
        return key

    def _prepare(self) -> tuple[np.ndarray, np.ndarray]:
        key = self._unsorted()
        order = np.argsort(key)
        self._sorted = (key[order], order)
        self._keys = None
        return self._sorted

    def _candidates(self, k: np.uint64) -> list[int]:
        """The positions whose key is ``k``, ascending."""
        srt = self._sorted
        if srt is None and self._scans < SCAN_LOOKUPS:
            self._scans += 1
            return np.flatnonzero(self._unsorted() == k).tolist()  # type: ignore[no-any-return]
        keys, order = srt or self._prepare()
        lo = int(keys.searchsorted(k, "left"))
        hi = int(keys.searchsorted(k, "right"))
        return sorted(order[lo:hi].tolist()) if hi > lo else []

    @staticmethod
    def _key(enc: bytes) -> int:
        """The sort key of one encoded string, as :meth:`_prepare` computes them all: the last 8 bytes
        of its GGUF encoding (length field, then the bytes) mixed with its length."""
        n = len(enc)
        return int.from_bytes((_LEN.pack(n) + enc)[-8:], "little") ^ ((n * _MIX) & _U64)

    def get(self, text: Any, default: Any = None) -> Any:  # type: ignore[override]
        if self._dict is not None:
            return self._dict.get(text, default)
        if self._left <= 0:
            return self.to_dict().get(text, default)
        if not isinstance(text, str):
            hash(text)  # an unhashable key raises TypeError, as a dict's lookup does
            return default
        self._left -= 1
        try:
            enc = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate no decoded string holds
            return default
        if enc.decode("utf-8", "surrogateescape") != text:  # escaped bytes spelling valid UTF-8
            return default
        n = len(enc)
        cand = self._candidates(np.uint64(self._key(enc)))
        if not cand:
            return default
        raw, off = self._s.raw, self._s.offsets
        for i in reversed(cand) if self._last else cand:
            s = int(off[i]) + 8
            if raw[s : s + n] == enc:
                return i
        return default

    # -- Mapping ---------------------------------------------------------------------------------------
    def __getitem__(self, text: str) -> int:
        i = self.get(text, _MISSING)
        if i is _MISSING:
            raise KeyError(text)
        return i  # type: ignore[no-any-return]

    def __contains__(self, text: object) -> bool:
        return self.get(text, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def keys(self) -> KeysView[str]:
        return self.to_dict().keys()

    def values(self) -> ValuesView[int]:
        return self.to_dict().values()

    def items(self) -> ItemsView[str, int]:
        return self.to_dict().items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringIndex):
            other = other.to_dict()
        return self.to_dict() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringIndex({len(self._s)} strings, {'last' if self._last else 'first'} wins, built={self.built})"
