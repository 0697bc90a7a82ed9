"""SentencePiece-style BPE as llama.cpp's llm_tokenizer_spm_session (works on raw bytes).

The text is cut into UTF-8 characters by their lead byte (no validation), then the pair whose merged
text is a token with the highest score (ties: leftmost) is merged until none is left; pieces that are
not tokens come out as byte tokens.
The loop runs in a Numba kernel, one call per fragment, over a hash table of the vocabulary bytes
(O(n log n) for any length); the table is also the text -> id map (:class:`TokenIndex`), so a
vocabulary of 262,144 tokens needs no dict of Python strings. ``spm_python`` is the same loop in Python.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)
_PY_MAX = 256  # (tests) a word longer than this ran in the kernel when short words ran in Python
_CACHE_BYTES = 256  # fragments up to this many bytes are cached, up to _CACHE_MAX of them
_CACHE_MAX = 1 << 14


def spm_python(
    text: str, t2i: Mapping[str, int], scores: Sequence[float], byte_ids: Sequence[int]
) -> list[int]:
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


class TokenIndex(Mapping[str, int]):
    """Token text -> id over the kernel's open-addressing hash table of the vocabulary bytes (a later id
    wins for a repeated text, as in llama.cpp's map): about 4 bytes a token plus the texts' bytes,
    where a dict of 262,144 tokens costs 15 MB and its construction a fifth of a second."""

    def __init__(self, tokens: Sequence[str]):
        from ._spm_kernel import _build_table, _pack

        self.tokens = tokens
        self.blob, self.offs, self.lens = _pack(tokens)
        size = 1
        while size < 2 * max(1, len(self.lens)):
            size <<= 1
        self.mask = size - 1
        self.table = _build_table(self.blob, self.offs, self.lens, self.mask)

    def get(self, text: str, default: int | None = None) -> int | None:  # type: ignore[override]
        from ._spm_kernel import _lookup

        key = np.frombuffer(text.encode("utf-8", "surrogateescape"), dtype=np.uint8)
        tid = _lookup(self.table, self.mask, self.blob, self.offs, self.lens, key, 0, key.size)
        return default if tid < 0 else int(tid)

    def __getitem__(self, text: str) -> int:
        tid = self.get(text) if isinstance(text, str) else None
        if tid is None:
            raise KeyError(text)
        return tid

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def __iter__(self) -> Iterator[str]:
        for tid in np.sort(self.table[self.table >= 0]).tolist():
            yield self.tokens[tid]

    def __len__(self) -> int:
        return int(np.count_nonzero(self.table >= 0))


class SPMTokenizer:
    """SPM over a vocabulary: llama.cpp's merge loop in the Numba kernel, one call per fragment, over the
    hash table of :class:`TokenIndex` (``spm_python`` is the same loop in Python, kept as a reference)."""

    def __init__(
        self, tokens: Sequence[str], t2i: Mapping[str, int], scores: np.ndarray, byte_ids: np.ndarray
    ):
        self.tokens = tokens
        self.t2i = t2i if isinstance(t2i, TokenIndex) else TokenIndex(tokens)
        self.scores = np.ascontiguousarray(scores, dtype=np.float32)
        self.scores_np = self.scores
        self.byte_ids_np = byte_ids  # int64[256]; -1 where the vocab has no byte token
        self.byte_ids = byte_ids.tolist()
        self._cache: dict[bytes, list[int]] = {}

    def tokenize_kernel(self, data: bytes) -> list[int]:
        """The whole merge loop in the Numba kernel, on raw bytes."""
        if not data:
            return []
        from ._spm_kernel import _spm_kernel

        t = self.t2i
        arr = np.frombuffer(data, dtype=np.uint8)
        out = np.empty(len(data), dtype=np.int64)
        n = _spm_kernel(arr, t.table, t.mask, t.blob, t.offs, t.lens, self.scores_np, self.byte_ids_np, out)
        return out[:n].tolist()

    def tokenize(self, data: bytes) -> list[int]:
        """Token ids of one escaped fragment (spaces already '▁'); short fragments are remembered (a kernel
        call costs 10-20 us, a repeated line or chat-template piece then costs a dict lookup)."""
        if len(data) > _CACHE_BYTES:
            return self.tokenize_kernel(data)
        ids = self._cache.get(data)
        if ids is None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            ids = self._cache[data] = self.tokenize_kernel(data)
        return list(ids)
