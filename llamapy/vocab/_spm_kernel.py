"""Numba kernels of the SPM tokenizer: a vocabulary hash table and llama.cpp's merge loop on bytes.

Imported only when a long word needs them (importing Numba costs about a second).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._numba import njit

_EMPTY = -1


@njit(cache=True)
def _fnv1a(data, start, n):  # pragma: no cover - compiled
    h = np.uint64(0xCBF29CE484222325)
    for i in range(start, start + n):
        h = (h ^ np.uint64(data[i])) * np.uint64(0x100000001B3)
    return h


@njit(cache=True)
def _build_table(blob, offs, lens, mask):  # pragma: no cover - compiled
    table = np.full(mask + 1, -1, dtype=np.int32)
    n = lens.shape[0]
    for tid in range(n):
        h = _fnv1a(blob, offs[tid], lens[tid]) & np.uint64(mask)
        slot = np.int64(h)
        while True:
            cur = table[slot]
            if cur == -1:
                table[slot] = tid
                break
            # same text: a later id wins (as in llama.cpp's token_to_id map)
            if lens[cur] == lens[tid]:
                same = True
                for k in range(lens[tid]):
                    if blob[offs[cur] + k] != blob[offs[tid] + k]:
                        same = False
                        break
                if same:
                    table[slot] = tid
                    break
            slot = (slot + 1) & mask
    return table


@njit(cache=True)
def _lookup(table, mask, blob, offs, lens, text, start, n):  # pragma: no cover - compiled
    h = _fnv1a(text, start, n) & np.uint64(mask)
    slot = np.int64(h)
    while True:
        tid = table[slot]
        if tid == -1:
            return -1
        if lens[tid] == n:
            same = True
            o = offs[tid]
            for k in range(n):
                if blob[o + k] != text[start + k]:
                    same = False
                    break
            if same:
                return tid
        slot = (slot + 1) & mask


@njit(cache=True)
def _better(s1, l1, s2, l2):  # pragma: no cover - compiled
    # priority: higher score first, then smaller left index
    return s1 > s2 or (s1 == s2 and l1 < l2)


@njit(cache=True)
def _spm_kernel(text, table, mask, blob, offs, lens, scores, byte_ids, out):  # pragma: no cover - compiled
    n_bytes = text.shape[0]
    # symbols
    sym_start = np.empty(n_bytes, dtype=np.int64)
    sym_n = np.empty(n_bytes, dtype=np.int64)
    n_sym = 0
    off = 0
    while off < n_bytes:
        b = text[off]
        hb = b >> 4
        ln = 1
        if hb == 12 or hb == 13:
            ln = 2
        elif hb == 14:
            ln = 3
        elif hb == 15:
            ln = 4
        if ln > n_bytes - off:
            ln = n_bytes - off
        sym_start[n_sym] = off
        sym_n[n_sym] = ln
        n_sym += 1
        off += ln
    prev = np.empty(n_sym, dtype=np.int64)
    nxt = np.empty(n_sym, dtype=np.int64)
    for i in range(n_sym):
        prev[i] = i - 1
        nxt[i] = i + 1 if i + 1 < n_sym else -1
    # binary heap of bigrams (score, left, right, size)
    cap = max(16, 2 * n_sym + 8)
    h_score = np.empty(cap, dtype=np.float32)
    h_left = np.empty(cap, dtype=np.int64)
    h_right = np.empty(cap, dtype=np.int64)
    h_size = np.empty(cap, dtype=np.int64)
    hn = 0
    # seed the queue with all adjacent pairs
    i = 1
    while True:
        # phase 1: seed
        if i >= n_sym:
            break
        left = i - 1
        right = i
        i += 1
        size = sym_n[left] + sym_n[right]
        tid = _lookup(table, mask, blob, offs, lens, text, sym_start[left], size)
        if tid == -1:
            continue
        if hn == cap:
            cap *= 2
            h_score = np.concatenate((h_score, np.empty(cap - hn, dtype=np.float32)))
            h_left = np.concatenate((h_left, np.empty(cap - hn, dtype=np.int64)))
            h_right = np.concatenate((h_right, np.empty(cap - hn, dtype=np.int64)))
            h_size = np.concatenate((h_size, np.empty(cap - hn, dtype=np.int64)))
        # sift up
        k = hn
        hn += 1
        sc = scores[tid]
        while k > 0:
            p = (k - 1) >> 1
            if _better(sc, left, h_score[p], h_left[p]):
                h_score[k] = h_score[p]
                h_left[k] = h_left[p]
                h_right[k] = h_right[p]
                h_size[k] = h_size[p]
                k = p
            else:
                break
        h_score[k] = sc
        h_left[k] = left
        h_right[k] = right
        h_size[k] = size
    while hn > 0:
        # pop top
        b_left = h_left[0]
        b_right = h_right[0]
        b_size = h_size[0]
        hn -= 1
        if hn > 0:
            ls = h_score[hn]
            ll = h_left[hn]
            lr = h_right[hn]
            lz = h_size[hn]
            k = 0
            while True:
                c = 2 * k + 1
                if c >= hn:
                    break
                if c + 1 < hn and _better(h_score[c + 1], h_left[c + 1], h_score[c], h_left[c]):
                    c += 1
                if _better(h_score[c], h_left[c], ls, ll):
                    h_score[k] = h_score[c]
                    h_left[k] = h_left[c]
                    h_right[k] = h_right[c]
                    h_size[k] = h_size[c]
                    k = c
                else:
                    break
            h_score[k] = ls
            h_left[k] = ll
            h_right[k] = lr
            h_size[k] = lz
        if sym_n[b_left] == 0 or sym_n[b_right] == 0 or sym_n[b_left] + sym_n[b_right] != b_size:
            continue
        sym_n[b_left] += sym_n[b_right]
        sym_n[b_right] = 0
        nxt[b_left] = nxt[b_right]
        if nxt[b_right] >= 0:
            prev[nxt[b_right]] = b_left
        # new bigrams: (prev, left) and (left, next)
        for which in range(2):
            if which == 0:
                left = prev[b_left]
                right = b_left
            else:
                left = b_left
                right = nxt[b_left]
            if left == -1 or right == -1:
                continue
            size = sym_n[left] + sym_n[right]
            tid = _lookup(table, mask, blob, offs, lens, text, sym_start[left], size)
            if tid == -1:
                continue
            if hn == cap:
                cap *= 2
                h_score = np.concatenate((h_score, np.empty(cap - hn, dtype=np.float32)))
                h_left = np.concatenate((h_left, np.empty(cap - hn, dtype=np.int64)))
                h_right = np.concatenate((h_right, np.empty(cap - hn, dtype=np.int64)))
                h_size = np.concatenate((h_size, np.empty(cap - hn, dtype=np.int64)))
            k = hn
            hn += 1
            sc = scores[tid]
            while k > 0:
                p = (k - 1) >> 1
                if _better(sc, left, h_score[p], h_left[p]):
                    h_score[k] = h_score[p]
                    h_left[k] = h_left[p]
                    h_right[k] = h_right[p]
                    h_size[k] = h_size[p]
                    k = p
                else:
                    break
            h_score[k] = sc
            h_left[k] = left
            h_right[k] = right
            h_size[k] = size
    # resegment: a symbol is a token, or its bytes become byte tokens
    n_out = 0
    s = 0 if n_sym > 0 else -1
    while s != -1:
        tid = _lookup(table, mask, blob, offs, lens, text, sym_start[s], sym_n[s])
        if tid != -1:
            out[n_out] = tid
            n_out += 1
        else:
            for k in range(sym_n[s]):
                out[n_out] = byte_ids[text[sym_start[s] + k]]
                n_out += 1
        s = nxt[s]
    return n_out


def _pack(tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """UTF-8 bytes of all tokens in one array, with offsets and lengths (surrogateescape kept)."""
    blob_of = getattr(tokens, "blob", None)
    if blob_of is not None:  # a StringArray read from the file: its bytes as they are
        blob, starts, lens = blob_of()
        return (blob if blob.size else np.zeros(1, dtype=np.uint8)), starts, lens
    n = len(tokens)
    joined = "\x00".join(tokens)
    if joined.count("\x00") == n - 1:  # fast path: no token holds NUL
        blob = np.frombuffer(joined.encode("utf-8", "surrogateescape"), dtype=np.uint8)
        seps = np.flatnonzero(blob == 0)
        starts = np.concatenate(([0], seps + 1)).astype(np.int64)
        ends = np.concatenate((seps, [blob.size])).astype(np.int64)
        lens = ends - starts
    else:
        data = [t.encode("utf-8", "surrogateescape") for t in tokens]
        lens = np.fromiter((len(t) for t in data), dtype=np.int64, count=n)
        blob = np.frombuffer(b"".join(data), dtype=np.uint8)
        starts = np.zeros(n, dtype=np.int64)
        if n > 1:
            np.cumsum(lens[:-1], out=starts[1:])
    if blob.size == 0:
        blob = np.zeros(1, dtype=np.uint8)
    return blob, starts, lens
