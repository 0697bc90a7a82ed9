"""Byte-pair encoding as llama.cpp's llm_tokenizer_bpe_session, with a cache of tokenized words."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..gguf.string_index import StringIndex, positions
from ..gguf.strings import StringArray
from . import unicode as U
from .pretokenize import PreTokenizer, compile_regexes, split

_CACHE_MAX = 1 << 17
_SHORT = 48  # words up to this many symbols use the simple quadratic loop; longer ones the heap
_KERNEL = 256  # words longer than this merge in the Numba kernel (O(n log n), about 40 bytes a character)


class OverBudget(Exception):
    """(internal) A fragment takes more tokens than the ``max_tokens`` it was given."""


def parse_merges(merges: Sequence[str]) -> Mapping[str, int]:
    """Merge rank by merge line ``"left right"``; like llama.cpp the first occurrence wins. The file's
    array (a :class:`StringArray`) is looked up in its bytes until a dict pays (:class:`StringIndex`).

    Lookups use ``left + " " + right``. Symbols never contain a space (byte-level BPE maps it to 'Ġ',
    SPM-style BPE to '▁'), so this finds exactly llama.cpp's (left, right) pairs, which split a line
    at its first space after position 0.
    """
    if isinstance(merges, StringArray):
        return StringIndex(merges, last=False)
    return positions(merges, last=False)


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
        self, token_to_id: Mapping[str, int], merges: Sequence[str], pre: PreTokenizer, is_gemma4: bool
    ):
        self.token_to_id = token_to_id
        self.ranks = parse_merges(merges)
        self.pre = pre
        self.regexes = compile_regexes(pre.regexes)
        self.is_gemma4 = is_gemma4
        self._cache = _WordCache(self._encode_word)
        self._pairs: dict[str, Any] | None = None
        self._inv_len: np.ndarray | None = None
        # fallback ids of single bytes, as llama.cpp looks them up
        fb: list[int | None] = []
        for b in range(256):
            key = f"<0x{b:02X}>" if not pre.byte_encode else bytes([b]).decode("utf-8", "surrogateescape")
            fb.append(token_to_id.get(key))
        self._byte_fallback = fb

    def tokenize(self, text: str, max_tokens: int | None = None) -> list[int]:
        """Token ids of one raw-text fragment (already whitespace-escaped if the vocab asks). With
        ``max_tokens``, raises :class:`OverBudget` as soon as the fragment is known to take more: after a
        word, or before a long word whose lower bound (:meth:`min_tokens`) is already too many."""
        out: list[int] = []
        get = self._cache.__getitem__
        if max_tokens is None:
            for word in split(text, self.regexes):
                out += get(word)
            return out
        for word in split(text, self.regexes):
            if (
                len(word) > _KERNEL
                and word not in self._cache
                and len(out) + self.min_tokens(word) > max_tokens
            ):
                raise OverBudget
            out += get(word)
            if len(out) > max_tokens:
                raise OverBudget
        return out

    def min_tokens(self, word: str) -> float:
        """A lower bound on the number of tokens of a (raw) word: each character c counts 1/L(c), L(c) the
        length of the longest token that holds c (a token of n characters then counts at most 1). Only
        where every symbol gives at least one token a character (see :meth:`_symbols_give_tokens`);
        else 0."""
        if self._inv_len is None:
            inv = np.zeros(1, dtype=np.float64)
            if self._symbols_give_tokens():
                longest: dict[str, int] = {}
                for t in self.token_to_id:
                    n = len(t)
                    for c in set(t):
                        if longest.get(c, 0) < n:
                            longest[c] = n
                inv = np.zeros(max(map(ord, longest), default=0) + 1, dtype=np.float64)
                for c, n in longest.items():
                    inv[ord(c)] = 1.0 / n
            self._inv_len = inv
        w = U.byte_encode(word) if self.pre.byte_encode else word
        cps = np.frombuffer(w.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        inv = self._inv_len
        return float(inv[cps[cps < inv.size]].sum()) - 1e-6 * len(w)  # (float rounding)

    def _encode_word(self, word: str) -> list[int]:
        return self._word(U.byte_encode(word) if self.pre.byte_encode else word)

    def _word(self, word: str) -> list[int]:
        t2i = self.token_to_id
        if not word:
            return []
        if (self.pre.ignore_merges or (self.is_gemma4 and not word.strip("\n"))) and word in t2i:
            return [t2i[word]]
        if len(word) > _KERNEL and " " not in word:
            return self._merge_kernel(word)
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
            else:
                out += self._fallback(s)
        return out

    def _symbols_give_tokens(self) -> bool:
        """Whether every symbol of a word becomes at least as many tokens as it has characters or is a
        token: every byte has a fallback token, or (byte-level BPE) every byte's character and every
        merge result are tokens."""
        if all(fb is not None for fb in self._byte_fallback):
            return True
        t2i = self.token_to_id
        if not self.pre.byte_encode or not all(c in t2i for c in U.BYTE_TO_UNICODE):
            return False
        for line in self.ranks:
            p = line.find(" ", 1)
            if p > 0 and line[:p] + line[p + 1 :] not in t2i:
                return False
        return True

    def _fallback(self, s: str) -> list[int]:
        """The byte tokens of a symbol that is not a token (those the vocabulary has)."""
        return [fb for fb in map(self._byte_fallback.__getitem__, U.encode_utf8(s)) if fb is not None]

    def _merge_kernel(self, word: str) -> list[int]:
        """The token ids of a long word (no spaces in it) from the Numba kernel: the same merges as
        :meth:`_merge_heap`, on symbol ids."""
        from ._bpe_kernel import bpe_merge

        pairs = self._pair_table()
        texts, sid_of, sid_tok = pairs["texts"], pairs["sid_of"], pairs["sid_tok"]
        cps = np.frombuffer(word.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        uniq = np.flatnonzero(np.bincount(cps))  # the distinct characters, in O(n)
        char_sid = np.full(int(uniq[-1]) + 1, -1, dtype=np.int32)
        char_sid[uniq] = [sid_of.get(chr(c), -1) for c in uniq.tolist()]
        sym = char_sid[cps]
        pos = np.empty(len(word), dtype=np.int32)
        n = bpe_merge(sym, pairs["keys"], pairs["ranks"], pairs["results"], pairs["mask"], pos)
        pos = pos[:n]
        final = sym[pos]
        toks = np.where(final >= 0, sid_tok[np.maximum(final, 0)], -1)
        missing = np.flatnonzero(toks < 0)
        if missing.size == 0:
            return toks.tolist()
        out: list[int] = []
        done = 0
        t2i = self.token_to_id
        for i in missing.tolist():
            out += toks[done:i].tolist()
            sid = int(final[i])
            text = texts[sid] if sid >= 0 else word[pos[i]]
            tid = t2i.get(text) if sid < 0 else None
            out += [tid] if tid is not None else self._fallback(text)
            done = i + 1
        out += toks[done:].tolist()
        return out

    def _pair_table(self) -> dict[str, Any]:
        """Symbol ids of every text a merge line names or makes, and the kernel's hash table of pairs
        (built once, on the first long word). A line can only match symbols without spaces when it has
        exactly one space with text on both sides (``_word`` keeps words with spaces in Python)."""
        if self._pairs is not None:
            return self._pairs
        from ._bpe_kernel import build_pair_table

        sid_of: dict[str, int] = {}
        texts: list[str] = []

        def sid(t: str) -> int:
            i = sid_of.get(t)
            if i is None:
                i = sid_of[t] = len(texts)
                texts.append(t)
            return i

        left, right, rank, merged = [], [], [], []
        for line, r in self.ranks.items():
            p = line.find(" ", 1)
            if p < 0 or " " in line[p + 1 :] or p == len(line) - 1:
                continue
            a, b = line[:p], line[p + 1 :]
            left.append(sid(a))
            right.append(sid(b))
            rank.append(r)
            merged.append(sid(a + b))
        size = 1
        while size < 2 * max(1, len(left)):
            size <<= 1
        i32 = np.int32
        keys, ranks, results = build_pair_table(
            np.array(left, i32), np.array(right, i32), np.array(rank, i32), np.array(merged, i32), size - 1
        )
        t2i = self.token_to_id
        sid_tok = np.array([t2i.get(t, -1) for t in texts] or [-1], dtype=np.int64)
        self._pairs = {"texts": texts, "sid_of": sid_of, "sid_tok": sid_tok, "keys": keys, "ranks": ranks,
                       "results": results, "mask": size - 1}  # fmt: skip
        return self._pairs

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
