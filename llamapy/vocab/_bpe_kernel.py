"""Numba kernels of the BPE tokenizer: llama.cpp's merge loop over one long word, on symbol ids.

Symbols are ids of texts (the single characters and both sides and the result of every merge line); a
hash table maps a pair of ids to its merge rank and the id of the merged text. The loop is the one of
``BPETokenizer._merge_heap`` (lowest rank first, then leftmost; stale entries skipped by size), O(n log n)
with about 40 bytes a character, and releases the GIL. Imported only when a word is long.
"""

from __future__ import annotations

import numpy as np

from .._numba import njit

_MUL = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def _slot(key, mask):  # pragma: no cover - compiled
    return np.int64((np.uint64(key) * _MUL) >> np.uint64(20)) & mask


@njit(cache=True, nogil=True)
def build_pair_table(left, right, rank, merged, mask):  # pragma: no cover - compiled
    """Open addressing over ``left << 32 | right``; the first (lowest rank) entry of a pair wins."""
    keys = np.full(mask + 1, -1, dtype=np.int64)
    ranks = np.zeros(mask + 1, dtype=np.int32)
    results = np.zeros(mask + 1, dtype=np.int32)
    for i in range(left.shape[0]):
        key = (np.int64(left[i]) << 32) | np.int64(right[i])
        s = _slot(key, mask)
        while keys[s] != -1 and keys[s] != key:
            s = (s + 1) & mask
        if keys[s] == -1 or rank[i] < ranks[s]:
            keys[s] = key
            ranks[s] = rank[i]
            results[s] = merged[i]
    return keys, ranks, results


@njit(cache=True, nogil=True)
def _find(keys, mask, a, b):  # pragma: no cover - compiled
    if a < 0 or b < 0:
        return -1
    key = (np.int64(a) << 32) | np.int64(b)
    s = _slot(key, mask)
    while True:
        k = keys[s]
        if k == key:
            return s
        if k == -1:
            return -1
        s = (s + 1) & mask


@njit(cache=True, nogil=True)
def _better(r1, l1, r2, l2):  # pragma: no cover - compiled
    return r1 < r2 or (r1 == r2 and l1 < l2)


@njit(cache=True, nogil=True)
def _push(h_rank, h_left, h_size, hn, rank, left, size):  # pragma: no cover - compiled
    k = hn
    while k > 0:
        p = (k - 1) >> 1
        if _better(rank, left, h_rank[p], h_left[p]):
            h_rank[k] = h_rank[p]
            h_left[k] = h_left[p]
            h_size[k] = h_size[p]
            k = p
        else:
            break
    h_rank[k] = rank
    h_left[k] = left
    h_size[k] = size
    return hn + 1


@njit(cache=True, nogil=True)
def bpe_merge(sym, keys, ranks, results, mask, out):  # pragma: no cover - compiled
    """Merges ``sym`` (int32 symbol ids, -1 for a character no merge knows) in place; writes the start
    positions of the final symbols to ``out`` (their ids are then ``sym[out]``) and returns their number."""
    n = sym.shape[0]
    ln = np.ones(n, dtype=np.int32)
    nxt = np.empty(n, dtype=np.int32)
    prev = np.empty(n, dtype=np.int32)
    for i in range(n):
        prev[i] = i - 1
        nxt[i] = i + 1 if i + 1 < n else -1
    cap = 2 * n + 8  # live entries: at most n - 1 seeds plus one more per merge
    h_rank = np.empty(cap, dtype=np.int32)
    h_left = np.empty(cap, dtype=np.int32)
    h_size = np.empty(cap, dtype=np.int32)
    hn = 0
    for i in range(1, n):
        s = _find(keys, mask, sym[i - 1], sym[i])
        if s >= 0:
            hn = _push(h_rank, h_left, h_size, hn, ranks[s], i - 1, 2)
    while hn > 0:
        left = h_left[0]
        size = h_size[0]
        hn -= 1
        if hn > 0:  # sift the last entry down from the root
            lr = h_rank[hn]
            ll = h_left[hn]
            lz = h_size[hn]
            k = 0
            while True:
                c = 2 * k + 1
                if c >= hn:
                    break
                if c + 1 < hn and _better(h_rank[c + 1], h_left[c + 1], h_rank[c], h_left[c]):
                    c += 1
                if _better(h_rank[c], h_left[c], lr, ll):
                    h_rank[k] = h_rank[c]
                    h_left[k] = h_left[c]
                    h_size[k] = h_size[c]
                    k = c
                else:
                    break
            h_rank[k] = lr
            h_left[k] = ll
            h_size[k] = lz
        right = nxt[left]
        if ln[left] == 0 or right < 0 or ln[left] + ln[right] != size:
            continue  # stale: one side has changed since this pair was queued
        s = _find(keys, mask, sym[left], sym[right])
        sym[left] = results[s]
        ln[left] += ln[right]
        ln[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        p = prev[left]
        if p >= 0:
            s = _find(keys, mask, sym[p], sym[left])
            if s >= 0:
                hn = _push(h_rank, h_left, h_size, hn, ranks[s], p, ln[p] + ln[left])
        r = nxt[left]
        if r >= 0:
            s = _find(keys, mask, sym[left], sym[r])
            if s >= 0:
                hn = _push(h_rank, h_left, h_size, hn, ranks[s], left, ln[left] + ln[r])
    m = 0
    i = 0
    while i != -1:
        out[m] = i
        m += 1
        i = nxt[i]
    return m
