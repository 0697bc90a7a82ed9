"""SentencePiece-style BPE as llama.cpp's llm_tokenizer_spm_session (works on raw bytes).

The text is cut into UTF-8 characters by their lead byte (no validation), then the pair whose merged
text is a token with the highest score (ties: leftmost) is merged until none is left; pieces that are
not tokens come out as byte tokens.
Speed: when no token can span the place before a '▁' that follows another character (true of
SentencePiece vocabularies, checked at load), a fragment is cut there into words whose results are
independent and cached, and short words run in Python. Long words (or fragments that are not valid
UTF-8 or hold a token that spans such a place) run through a Numba kernel over a hash table of the
vocabulary: O(n log n) for any length.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence

import numpy as np

_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)
_WORDS = re.compile("\u2581*[^\u2581]+|\u2581+")
_BRIDGE = re.compile("[^\u2581\x00]\u2581")
_PY_MAX = 256  # words up to this many chars run in Python


def spm_python(text: str, t2i: dict[str, int], scores: Sequence[float], byte_ids: Sequence[int]) -> list[int]:
    """llama.cpp's SPM merge loop on valid text (one symbol per character), in Python."""
    sym = list(text)
    n = len(sym)
    if n == 0:
        return []
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    heap: list[tuple[float, int, int, int]] = []
    get = t2i.get

    def add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        t = sym[left] + sym[right]
        tid = get(t)
        if tid is not None:
            heapq.heappush(heap, (-scores[tid], left, right, len(sym[left]) + len(sym[right])))

    for i in range(1, n):
        add(i - 1, i)
    lens = [1] * n
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if lens[left] == 0 or lens[right] == 0 or lens[left] + lens[right] != size:
            continue
        sym[left] += sym[right]
        lens[left] += lens[right]
        lens[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        add(prev[left], left)
        add(left, nxt[left])
    out: list[int] = []
    i = 0
    while i != -1:
        tid = get(sym[i])
        if tid is not None:
            out.append(tid)
        else:
            out.extend(byte_ids[b] for b in sym[i].encode("utf-8", "surrogatepass"))
        i = nxt[i]
    return out


class SPMTokenizer:
    """SPM over a vocabulary: Python for short words, the Numba kernel for the rest."""

    def __init__(self, tokens: Sequence[str], t2i: dict[str, int], scores: np.ndarray, byte_ids: np.ndarray):
        self.tokens = tokens
        self.t2i = t2i
        self.scores_np = np.ascontiguousarray(scores, dtype=np.float32)
        self.scores = self.scores_np.tolist()
        self.byte_ids_np = byte_ids  # int64[256]; -1 where the vocab has no byte token
        self.byte_ids = byte_ids.tolist()
        # texts of tokens that hold '▁' after another character (they could join two words)
        joined = "\x00".join(tokens)
        hits = [m.start() for m in _BRIDGE.finditer(joined)]
        if hits:
            nuls = np.flatnonzero(np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32) == 0)
            bridges = {tokens[int(i)] for i in np.searchsorted(nuls, hits)}
        else:
            bridges = set()
        self.bridges = sorted(bridges)
        self.chunked = len(self.bridges) <= 64  # else every fragment is one word
        self._cache: dict[str, list[int]] = {}
        self._kernel_data: tuple | None = None

    def _kernel_tables(self) -> tuple:
        if self._kernel_data is None:
            from ._spm_kernel import _build_table, _pack

            blob, offs, lens = _pack(self.tokens)
            size = 1
            while size < 2 * max(1, len(lens)):
                size <<= 1
            mask = size - 1
            self._kernel_data = (_build_table(blob, offs, lens, mask), mask, blob, offs, lens)
        return self._kernel_data

    def tokenize_kernel(self, data: bytes) -> list[int]:
        """The whole merge loop in the Numba kernel, on raw bytes."""
        if not data:
            return []
        from ._spm_kernel import _spm_kernel

        table, mask, blob, offs, lens = self._kernel_tables()
        arr = np.frombuffer(data, dtype=np.uint8)
        out = np.empty(len(data), dtype=np.int64)
        n = _spm_kernel(arr, table, mask, blob, offs, lens, self.scores_np, self.byte_ids_np, out)
        return out[:n].tolist()

    def _word(self, word: str) -> list[int]:
        ids = self._cache.get(word)
        if ids is None:
            if len(word) <= _PY_MAX:
                ids = spm_python(word, self.t2i, self.scores, self.byte_ids)
            else:
                ids = self.tokenize_kernel(word.encode("utf-8", "surrogatepass"))
            if len(self._cache) >= 1 << 17:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def tokenize(self, data: bytes) -> list[int]:
        """Token ids of one escaped fragment (spaces already '▁')."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return self.tokenize_kernel(data)
        if not self.chunked or any(b in text for b in self.bridges):
            if len(text) <= _PY_MAX:
                return spm_python(text, self.t2i, self.scores, self.byte_ids)
            return self.tokenize_kernel(data)
        out: list[int] = []
        for w in _WORDS.findall(text):
            out.extend(self._word(w))
        return out
