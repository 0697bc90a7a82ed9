"""Byte-pair encoding as llama.cpp's llm_tokenizer_bpe_session, with a cache of tokenized words."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import chain

from . import unicode as U
from .pretokenize import PreTokenizer, compile_regexes, split

_CACHE_MAX = 1 << 17
_SHORT = 48  # words up to this many symbols use the simple quadratic loop; longer ones the heap


def parse_merges(merges: Sequence[str]) -> dict[str, int]:
    """Merge rank by merge line ``"left right"``; like llama.cpp the first occurrence wins.

    Lookups use ``left + " " + right``. Symbols never contain a space (byte-level BPE maps it to 'Ġ',
    SPM-style BPE to '▁'), so this finds exactly llama.cpp's (left, right) pairs, which split a line
    at its first space after position 0.
    """
    n = len(merges)
    return dict(zip(reversed(merges), range(n - 1, -1, -1), strict=True))


class _WordCache(dict):
    """word -> token ids; computes missing words (and forgets everything when it grows too large)."""

    def __init__(self, compute):  # type: ignore[no-untyped-def]
        super().__init__()
        self.compute = compute

    def __missing__(self, word: str) -> list[int]:
        ids = self.compute(word)
        if len(self) >= _CACHE_MAX:
            self.clear()
        self[word] = ids
        return ids


class BPETokenizer:
    """Word-level BPE over the pre-tokenizer's words."""

    def __init__(
        self, token_to_id: dict[str, int], merges: Sequence[str], pre: PreTokenizer, is_gemma4: bool
    ):
        self.token_to_id = token_to_id
        self.ranks = parse_merges(merges)
        self.pre = pre
        self.regexes = compile_regexes(pre.regexes)
        self.is_gemma4 = is_gemma4
        self._cache = _WordCache(self._encode_word)
        # fallback ids of single bytes, as llama.cpp looks them up
        fb: list[int | None] = []
        for b in range(256):
            key = f"<0x{b:02X}>" if not pre.byte_encode else bytes([b]).decode("utf-8", "surrogateescape")
            fb.append(token_to_id.get(key))
        self._byte_fallback = fb

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (already whitespace-escaped if the vocab asks)."""
        return list(chain.from_iterable(map(self._cache.__getitem__, split(text, self.regexes))))

    def _encode_word(self, word: str) -> list[int]:
        return self._word(U.byte_encode(word) if self.pre.byte_encode else word)

    def _word(self, word: str) -> list[int]:
        t2i = self.token_to_id
        if not word:
            return []
        if (self.pre.ignore_merges or (self.is_gemma4 and not word.strip("\n"))) and word in t2i:
            return [t2i[word]]
        symbols = list(word) if len(word) <= _SHORT else self._merge_heap(word)
        ranks = self.ranks
        while len(symbols) > 1:
            best = None
            best_i = -1
            for i in range(len(symbols) - 1):
                r = ranks.get(symbols[i] + " " + symbols[i + 1])
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            symbols[best_i : best_i + 2] = [symbols[best_i] + symbols[best_i + 1]]
        out: list[int] = []
        for s in symbols:
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
                continue
            for b in U.encode_utf8(s):
                fb = self._byte_fallback[b]
                if fb is not None:
                    out.append(fb)
        return out

    def _merge_heap(self, word: str) -> list[str]:
        """llama.cpp's priority-queue merge loop (lowest rank first, then leftmost): O(n log n)."""
        sym = list(word)
        n = len(sym)
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        ranks = self.ranks
        heap: list[tuple[int, int, int, str]] = []

        def add(left: int, right: int) -> None:
            if left != -1 and right != -1:
                r = ranks.get(sym[left] + " " + sym[right])
                if r is not None:
                    heapq.heappush(heap, (r, left, right, sym[left] + sym[right]))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
                continue
            sym[left] = text
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        return [t for t in sym if t]
