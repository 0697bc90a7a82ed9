"""Self-speculative n-gram drafts, llama.cpp's ``--spec-type ngram-simple`` and ``ngram-map-k``
(``common/ngram-map.cpp``): no second model, the guesses are copied from earlier in the sequence (the
prompt and what was generated), which pays off on code edits, quoting, summaries, JSON.

Both are draft models in the ``draft(input_ids) -> token ids`` sense of :mod:`.speculative`:
``input_ids`` end with the token just sampled; each returns the tokens that followed the last
``size_n`` tokens the last time they occurred. The verification (and so the output, identical to
decoding without a draft) is :func:`~.loop.generate`'s or the server engine's.

- :class:`NgramSimple` searches the history backwards for the key on every call (``ngram-simple``:
  defaults ``size_n`` 12, ``size_m`` 48, as llama.cpp's).
- :class:`NgramMapK` keeps a per-sequence map from key n-grams to where they last started, updated
  incrementally as the sequence grows (a rewritten tail is dropped from it), proposes only keys seen at
  least ``min_hits`` times, and shortens its next proposal for a key to what was accepted the last
  time (``ngram-map-k``, a simplified port: one value per key).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import LlamapyError
from .speculative import LlamaDraftModel


class NgramError(LlamapyError, ValueError):
    """Bad n-gram draft parameters."""


def _check(size_n: int, size_m: int, min_hits: int) -> tuple[int, int, int]:
    n, m, h = int(size_n), int(size_m), int(min_hits)
    if not 1 <= n <= 1024 or not 1 <= m <= 1024 or not 1 <= h <= 1 << 16:
        raise NgramError(
            f"n-gram draft needs 1 <= size_n <= 1024, 1 <= size_m <= 1024 and min_hits >= 1; "
            f"got size_n={size_n}, size_m={size_m}, min_hits={min_hits}"
        )
    return n, m, h


def ngram_simple_draft(tokens: Sequence[int], size_n: int, size_m: int) -> list[int]:
    """llama.cpp's ``common_ngram_simple_draft``: ``tokens`` end with the sampled token; find the last
    ``size_n`` of them earlier in ``tokens`` (searching backwards, the current occurrence excluded) and
    return up to ``size_m`` tokens that followed (none when fewer than ``size_n`` would)."""
    cur = len(tokens) - 1  # llama.cpp's cur_len: the history before the sampled token
    if cur <= size_n + size_m + 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    pattern = arr[cur - size_n + 1 : cur + 1]
    windows = np.lib.stride_tricks.sliding_window_view(arr[: cur + 1], size_n)
    # candidate starts j in [1, cur - size_n - 1], latest first (llama.cpp ignores j == 0)
    hits = np.nonzero(np.all(windows[1 : cur - size_n] == pattern, axis=1))[0]
    if not len(hits):
        return []
    j = int(hits[-1]) + 1
    n_copy = min(size_m, cur - (j + size_n))
    if n_copy < size_n:
        return []
    return [int(t) for t in arr[j + size_n : j + size_n + n_copy]]


class NgramSimple(LlamaDraftModel):
    """``--spec-type ngram-simple``."""

    spec_type = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1) -> None:
        self.size_n, self.size_m, self.min_hits = _check(size_n, size_m, min_hits)
        self.n_drafted = 0
        self.n_calls = 0

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        self.n_calls += 1
        out = ngram_simple_draft(
            [int(t) for t in np.asarray(input_ids).reshape(-1)], self.size_n, self.size_m
        )
        self.n_drafted += len(out)
        return np.asarray(out, dtype=np.intc)


class NgramMapK(LlamaDraftModel):
    """``--spec-type ngram-map-k`` (see the module docstring). One instance per sequence (slot)."""

    spec_type = "ngram-map-k"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1) -> None:
        self.size_n, self.size_m, self.min_hits = _check(size_n, size_m, min_hits)
        self.tokens: list[int] = []  # the history the map was built from
        self.key_pos: dict[tuple[int, ...], int] = {}  # key n-gram -> its latest start (with a full value)
        self.hits: dict[tuple[int, ...], int] = {}
        self.n_accept: dict[tuple[int, ...], int] = {}  # key -> tokens of its value accepted last time
        self.n_indexed = 0  # keys starting before this index are in key_pos
        self.last: tuple[tuple[int, ...], int, list[int]] | None = None  # (key, where, draft) last proposed
        self.n_drafted = 0
        self.n_calls = 0

    def _resync(self, ids: list[int]) -> None:
        """Drop what the map knows beyond the common prefix with ``ids`` (a rewritten tail)."""
        n = 0
        for a, b in zip(self.tokens, ids, strict=False):
            if a != b:
                break
            n += 1
        if n < len(self.tokens):
            cut = max(0, n - self.size_n - self.size_m)
            if cut < self.n_indexed:
                self.key_pos = {k: p for k, p in self.key_pos.items() if p < cut}
                self.n_indexed = cut
        self.tokens = ids

    def _learn(self, ids: list[int]) -> None:
        """Score the last proposal: how many of its tokens the sequence now continues with (nothing
        learnt when the history before it was rewritten)."""
        if self.last is None:
            return
        key, at, draft = self.last
        self.last = None
        if len(ids) < at or self.tokens[:at] != ids[:at]:
            return
        n_ok = 0
        for i, t in enumerate(draft):
            if at + i >= len(ids) or ids[at + i] != t:
                break
            n_ok += 1
        self.n_accept[key] = max(1, n_ok) if n_ok < len(draft) else self.size_m

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        self.n_calls += 1
        ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        self._learn(ids)
        self._resync(ids)
        n, m = self.size_n, self.size_m
        cur = len(ids)
        key = tuple(ids[cur - n :])
        if cur < 2 * n + m:
            return np.zeros(0, dtype=np.intc)
        # index every key that has a complete value after it and is not the current key
        end = cur - n - m
        for j in range(self.n_indexed, end):
            self.key_pos[tuple(ids[j : j + n])] = j
        self.n_indexed = max(self.n_indexed, end)
        pos = self.key_pos.get(key)
        if pos is None:
            return np.zeros(0, dtype=np.intc)
        self.hits[key] = hits = self.hits.get(key, 0) + 1
        if hits < self.min_hits:
            return np.zeros(0, dtype=np.intc)
        n_take = min(m, self.n_accept.get(key, m))
        draft = ids[pos + n : pos + n + n_take]
        self.last = (key, cur, draft)
        self.n_drafted += len(draft)
        return np.asarray(draft, dtype=np.intc)


__all__ = ["NgramError", "NgramMapK", "NgramSimple", "ngram_simple_draft"]
