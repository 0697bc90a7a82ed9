"""What each replica's prompt cache probably holds, as chained hashes of fixed-size blocks of token ids.

The router (:mod:`llamapy.ray.router`) records the tokens of every request it sends to a replica and, for a
new request, finds the replica whose recorded blocks match the longest prefix of its tokens (as Ray Serve
LLM's prefix-aware router and llm-d's KV-cache-aware scorer do; they hash blocks of the prompt the same way).
Block ``i``'s key hashes block ``i - 1``'s key with the block's tokens, so a matching key means the whole
prefix up to it matches. A replica's blocks are kept in LRU order and capped: an engine evicts too, and a
map that only grows would route to caches long gone. Pure Python, no Ray: tested on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

BLOCK = 16  # tokens per block: a shorter match is not worth a detour from the least loaded replica


def block_keys(tokens: Sequence[int], block: int = BLOCK) -> list[int]:
    """The chained key of each whole block of ``tokens`` (a trailing partial block has none)."""
    keys: list[int] = []
    h = 0
    for i in range(0, len(tokens) - block + 1, block):
        h = hash((h, tuple(tokens[i : i + block])))
        keys.append(h)
    return keys


class PrefixIndex:
    """Block keys per replica: ``insert`` what a replica served, ``match`` a prompt, ``forget`` a replica."""

    def __init__(self, block: int = BLOCK, max_blocks_per_replica: int = 8192) -> None:
        if block < 1 or max_blocks_per_replica < 1:
            raise ValueError("block and max_blocks_per_replica must be at least 1")
        self.block = block
        self.max_blocks = max_blocks_per_replica
        self._by_replica: dict[Hashable, OrderedDict[int, None]] = {}
        self._owners: dict[int, set[Hashable]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def replicas(self) -> list[Hashable]:
        return list(self._by_replica)

    def n_blocks(self, replica: Hashable) -> int:
        return len(self._by_replica.get(replica, ()))

    def insert(self, replica: Hashable, tokens: Sequence[int]) -> int:
        """Record that ``replica`` holds ``tokens`` in its cache; returns the number of blocks recorded."""
        keys = block_keys(tokens, self.block)
        lru = self._by_replica.setdefault(replica, OrderedDict())
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
                self._owners.setdefault(k, set()).add(replica)
        while len(lru) > self.max_blocks:
            old, _ = lru.popitem(last=False)
            self._drop_owner(old, replica)
        return len(keys)

    def match(
        self, tokens: Sequence[int], candidates: Iterable[Hashable] | None = None
    ) -> dict[Hashable, int]:
        """For each replica (of ``candidates``, or all) with a match, how many leading tokens it holds."""
        alive = set(self._by_replica) if candidates is None else set(candidates) & set(self._by_replica)
        depth: dict[Hashable, int] = {}
        for i, k in enumerate(block_keys(tokens, self.block)):
            alive &= self._owners.get(k, set())
            if not alive:
                break
            for r in alive:
                depth[r] = (i + 1) * self.block
        return depth

    def forget(self, replica: Hashable) -> None:
        """Drop everything recorded for ``replica`` (it died, restarted or was scaled away)."""
        for k in self._by_replica.pop(replica, OrderedDict()):
            self._drop_owner(k, replica)

    def _drop_owner(self, key: int, replica: Hashable) -> None:
        owners = self._owners.get(key)
        if owners is not None:
            owners.discard(replica)
            if not owners:
                del self._owners[key]
