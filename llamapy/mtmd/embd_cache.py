"""Encode once: image and audio embeddings cached by content, so that a conversation that resends the
same picture each turn (every OpenAI client does), or two slots sending it, pay the encoder once
(llama.cpp #18686, llama-cpp-python #2222).

:class:`EmbeddingCache` is an LRU bounded in bytes (``--mmproj-cache-mb``; 0 turns it off), keyed by
:func:`chunk_key`: the chunk kind, the hash of the preprocessed input the encoder reads (the pixels
after resizing/padding/normalizing, or the log-mel window: the bitmap's bytes and every preprocessing
parameter show in it) and its shape. One cache belongs to one :class:`~llamapy.mtmd.MtmdContext` (one
mmproj), which the server's slots share. Entries are read-only arrays; it is safe across threads.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

DEFAULT_CACHE_MB = 256.0


def chunk_key(kind: str, data: np.ndarray) -> str:
    """The cache key of an encoder input: its kind, dtype, shape and the BLAKE2b hash of its bytes."""
    a = np.ascontiguousarray(data)
    h = hashlib.blake2b(a.view(np.uint8).reshape(-1), digest_size=20).hexdigest()
    return f"{kind}:{a.dtype.str}:{'x'.join(map(str, a.shape))}:{h}"


class EmbeddingCache:
    """LRU of embeddings by key, at most ``max_bytes`` in all (an entry larger than that is not kept)."""

    def __init__(self, max_bytes: int = int(DEFAULT_CACHE_MB * 2**20)) -> None:
        self._lock = threading.Lock()
        self._d: OrderedDict[str, np.ndarray] = OrderedDict()
        self.n_bytes = 0
        self.max_bytes = 0
        self.hits = 0
        self.misses = 0
        self.resize(max_bytes)

    def resize(self, max_bytes: int) -> None:
        """Change the bound (evicting the least recently used entries to fit)."""
        max_bytes = int(max_bytes)
        if max_bytes < 0:
            raise ValueError(f"the embedding cache size must be 0 (off) or more bytes, got {max_bytes}")
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def _evict(self) -> None:
        while self._d and self.n_bytes > self.max_bytes:
            _, old = self._d.popitem(last=False)
            self.n_bytes -= old.nbytes

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            e = self._d.get(key)
            if e is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return e

    def put(self, key: str, embd: np.ndarray) -> np.ndarray:
        """Keep ``embd`` under ``key`` (as a read-only copy when it fits); returns what to use."""
        e = np.array(embd, dtype=np.float32, copy=True)
        e.flags.writeable = False
        if e.nbytes > self.max_bytes:
            return e
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self.n_bytes -= old.nbytes
            self._d[key] = e
            self.n_bytes += e.nbytes
            self._evict()
        return e

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.n_bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._d), "bytes": self.n_bytes, "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses}  # fmt: skip


__all__ = ["DEFAULT_CACHE_MB", "EmbeddingCache", "chunk_key"]
