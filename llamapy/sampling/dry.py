"""DRY ("don't repeat yourself"), as llama.cpp ports it from koboldcpp: penalize tokens that would
extend a sequence already seen in the last ``dry_penalty_last_n`` tokens, exponentially in its length.

Sequence breakers (strings such as ``"\\n"``) end the search for repeats; they are turned into token
sequences once, from the vocabulary's token texts (``token_to_piece``) and its tokenizer.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from .samplers import Sampler
from .token_data import TokenDataArray

MAX_CHAR_LEN = 40  # bytes of a breaker (llama.cpp truncates longer ones; the server refuses them)
MAX_SEQ_LEN = 20
MAX_BREAKERS = 64  # breakers per request (the server's limit: llama.cpp has none)
_CACHE_SIZE = 32  # processed breaker lists kept per vocabulary
FLOAT_MAX_LOG = 88.7228391


def _pieces(vocab: Any) -> tuple:
    """Every token's text (special tokens rendered), joined into one blob with start offsets, and the
    reversed texts sorted (with their token ids); cached on the vocab object when it allows attributes."""
    cached = getattr(vocab, "_llamapy_dry_pieces", None)
    if cached is not None:
        return cached
    pieces = []
    for t in range(int(vocab.n_tokens)):
        piece = vocab.token_to_piece(t, special=True)
        pieces.append(piece.encode("utf-8") if isinstance(piece, str) else bytes(piece))
    starts = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=starts[1:])
    rev = [p[::-1] for p in pieces]
    order = sorted(range(len(pieces)), key=rev.__getitem__)
    out = (pieces, b"".join(pieces), starts, [rev[t] for t in order], order)
    try:
        vocab._llamapy_dry_pieces = out
    except AttributeError:
        pass
    return out


def _ending_with(index: tuple, suffix: bytes) -> list[int]:
    """Tokens whose text ends with ``suffix`` (a binary search over the reversed texts, sorted)."""
    keys, order = index[3], index[4]
    rs = suffix[::-1]
    out = []
    i = bisect_left(keys, rs)
    while i < len(keys) and keys[i].startswith(rs):
        out.append(order[i])
        i += 1
    return sorted(out)


_cache_lock = threading.Lock()


def cached_breakers(vocab: Any, breakers: list[str]) -> dict:
    """:func:`breakers_from_vocab`, memoized per vocabulary (the last few lists): the server builds a
    request's breakers on a request thread, so that the engine thread only looks them up."""
    key = tuple(breakers)
    cache = getattr(vocab, "_llamapy_dry_cache", None)
    if cache is None:
        cache = OrderedDict()
        try:
            vocab._llamapy_dry_cache = cache
        except AttributeError:
            return breakers_from_vocab(vocab, breakers)
    with _cache_lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    out = breakers_from_vocab(vocab, list(breakers))
    with _cache_lock:
        cache[key] = out
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    return out


def breakers_from_vocab(vocab: Any, breakers: list[str], max_tail_len: int = MAX_SEQ_LEN) -> dict:
    """``get_overlapping_token_sequences``: head token -> list of tail token sequences.

    A token whose text contains a breaker is a breaker on its own (empty tail); a token whose text ends
    with the first ``j`` bytes of a breaker gets the tokenization of the rest as its tail.
    """
    out: dict[int, list[tuple[int, ...]]] = {}
    if not breakers:
        return out
    index = _pieces(vocab)
    blob, starts = index[1], index[2]
    for s in breakers:
        if not s:
            continue
        bs = s.encode("utf-8")[:MAX_CHAR_LEN]
        # every occurrence (overlapping too) that lies inside one token's text
        pos = np.array([m.start() for m in re.finditer(b"(?=" + re.escape(bs) + b")", blob)], dtype=np.int64)
        contain: set[int] = set()
        if len(pos):
            tok = np.searchsorted(starts, pos, side="right") - 1
            inside = pos + len(bs) <= starts[tok + 1]
            contain = {int(t) for t in np.unique(tok[inside])}
        for t in sorted(contain):
            out.setdefault(t, []).append(())
        for j in range(len(bs) - 1, 0, -1):
            prefix, rest = bs[:j], bs[j:]
            heads = [t for t in _ending_with(index, prefix) if t not in contain]
            if not heads:
                continue
            tail = tuple(vocab.tokenize(rest, add_special=False, parse_special=False))
            if max_tail_len >= 0:
                tail = tail[:max_tail_len]
            for t in heads:
                seqs = out.setdefault(t, [])
                if tail not in seqs:
                    seqs.append(tail)
    return out


class DRYSampler(Sampler):
    name = "dry"

    def __init__(
        self,
        multiplier: float,
        base: float,
        allowed_length: int,
        penalty_last_n: int,
        seq_breakers: list[str] | None = None,
        vocab: Any = None,
        breaker_tokens: list[list[int]] | None = None,
    ) -> None:
        """``seq_breakers`` need ``vocab`` (``n_tokens``, ``token_to_piece``, ``tokenize``);
        ``breaker_tokens`` gives breakers directly as token sequences (as llama.cpp's tests do)."""
        self.multiplier = float(multiplier)
        self.base = float(base)
        self.allowed_length = int(allowed_length)
        self.penalty_last_n = max(int(penalty_last_n), 0)
        self._breakers: dict[int, list[tuple[int, ...]]] = {}
        if self.enabled:
            if seq_breakers and vocab is not None:
                self._breakers = cached_breakers(vocab, list(seq_breakers))
            if breaker_tokens:  # the cached dict is shared: extend a copy
                self._breakers = {t: list(seqs) for t, seqs in self._breakers.items()}
            for seq in breaker_tokens or []:
                if seq:
                    self._breakers.setdefault(int(seq[0]), []).append(tuple(int(t) for t in seq[1:]))
        self._last: deque[int] = deque(maxlen=max(self.penalty_last_n, 1))

    @property
    def enabled(self) -> bool:
        # llama.cpp compares its float copies (a base of 0.99999999 is 1.0f)
        return np.float32(self.multiplier) != 0 and np.float32(self.base) >= 1 and self.penalty_last_n != 0

    def accept(self, token: int) -> None:
        if self.enabled:
            self._last.append(int(token))

    def reset(self) -> None:
        self._last.clear()

    def apply(self, cur: TokenDataArray) -> None:
        if not self.enabled:
            return
        last = list(self._last)
        n = min(len(last), self.penalty_last_n)
        if n <= self.allowed_length:
            return
        rat = last[::-1]  # rat[i] = i-th most recent token
        brk = self._breakers

        # Step 1: the nearest restart sequence limits the repetition length
        rep_limit = n
        for i in range(n):
            seqs = brk.get(rat[i])
            if not seqs:
                continue
            longest = -1
            for tail in seqs:
                sl = len(tail)
                if longest < sl <= i and all(tail[o] == rat[i - o - 1] for o in range(sl)):
                    longest = sl
            if longest >= 0:
                rep_limit = i - longest
                break
        if rep_limit < self.allowed_length:
            return

        # Step 2: Z-algorithm over the reversed context: repeat[last - k] = length of the suffix match
        repeat = [0] * n
        lastk = n - 1
        lt = rt = 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and rat[m] == rat[m + k]:
                    m += 1
                repeat[lastk - k] = min(m, rep_limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p = k - lt
                right = rt - k + 1
                if repeat[lastk - p] < right:
                    repeat[lastk - k] = min(repeat[lastk - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat[i] == rat[i - k]:
                        i += 1
                    repeat[lastk - k] = min(i - k, rep_limit)
                    lt, rt = k, i - 1

        # Step 3: the token after each repeat would extend it
        max_rep: dict[int, int] = {}
        for i in range(n - 1):
            rl = repeat[i]
            if rl >= self.allowed_length:
                tok = rat[n - 2 - i]
                if max_rep.get(tok, -1) < rl:
                    max_rep[tok] = rl
        if not max_rep:
            cur.sorted = False
            return

        # Step 4: penalties, except for single-token sequence breakers
        max_exp = (
            int(np.float32(FLOAT_MAX_LOG) / np.log(np.float32(self.base))) if self.base > 1.000001 else 0
        )
        toks, pens = [], []
        for tok, rl in max_rep.items():
            if () in brk.get(tok, ()):
                continue
            e = rl - self.allowed_length
            if max_exp > 0 and e > max_exp:
                e = max_exp
            toks.append(tok)
            # float * std::pow(float, int): both promoted to double, the product rounded to float once
            with np.errstate(over="ignore"):
                pens.append(
                    np.float32(
                        np.float64(np.float32(self.multiplier)) * np.float64(np.float32(self.base)) ** e
                    )
                )
        pos, which = cur.positions_of(np.array(toks, dtype=np.int64))
        if len(pos):
            cur.mutable_logits()[pos] -= np.array(pens, dtype=np.float32)[which]
        cur.sorted = False
