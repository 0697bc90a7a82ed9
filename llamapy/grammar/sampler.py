"""``GrammarSampler``: a grammar as one sampler of the chain (llama.cpp's ``llama_sampler_llg``).

``apply`` sets the logit of every token the grammar forbids to -inf, from llguidance's bitmask (computed
into a preallocated int32 array, applied by a Numba pass over the candidates). End-of-generation (EOG)
tokens are allowed exactly when the output so far is a complete sentence of the grammar; once the
grammar is finished (complete and not extensible) only EOG tokens are allowed. ``accept`` consumes the
sampled token; a token the grammar forbids raises GrammarError and leaves the state as it was.

Lazy grammars (``LlamaGrammar.lazy``) constrain nothing until a trigger fires on the generated text
(token pieces with special tokens spelled out). The grammar then starts at the trigger: the tokens from
there on are fed to it (the first one cut at the trigger and re-tokenized when the trigger starts inside
it; a special token the grammar only accepts as text is fed as its text). Those tokens were generated
unconstrained and cannot be undone, so the rule is: they are fed as far as the grammar accepts them (byte
by byte inside the token where they stop matching), the rest is dropped, and the grammar constrains every
later token from that state. It never goes back to inactive (``reset`` or a ``rollback`` past the trigger
does).

Where a grammar forces text, llguidance allows only the canonical tokenization of it (the vocabulary's
own, as in llama.cpp with llguidance); ``accept`` takes any tokenization of allowed text.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .._numba import njit
from ..sampling.samplers import Sampler
from ..sampling.token_data import TokenDataArray
from .errors import GrammarError
from .grammar import LlamaGrammar, compile_trigger
from .tokenizer import exact_tokenize, vocab_info

_NEG_INF = np.float32(-np.inf)


@njit(cache=True)
def _mask_all(logits, mask):  # pragma: no cover - compiled
    """Candidates in id order (``logits[i]`` is token i): -inf where the bit is clear or past the mask."""
    n = logits.shape[0]
    ninf = np.float32(-np.inf)
    nw = mask.shape[0]
    for w in range(nw):
        base = w * 32
        if base >= n:
            break
        m = mask[w]
        if m == -1:
            continue
        end = min(base + 32, n)
        if m == 0:
            for i in range(base, end):
                logits[i] = ninf
        else:
            for i in range(base, end):
                if (m >> (i - base)) & 1 == 0:
                    logits[i] = ninf
    for i in range(nw * 32, n):
        logits[i] = ninf


@njit(cache=True)
def _mask_ids(logits, ids, mask, n_vocab):  # pragma: no cover - compiled
    """Candidates ``ids[j]`` with ``logits[j]``: -inf where the token's bit is clear or out of range."""
    ninf = np.float32(-np.inf)
    for j in range(ids.shape[0]):
        t = ids[j]
        if t < 0 or t >= n_vocab or (mask[t >> 5] >> (t & 31)) & 1 == 0:
            logits[j] = ninf


class GrammarSampler(Sampler):
    """Constrains sampling to ``grammar`` for the vocabulary ``vocab`` (see the module docstring)."""

    name = "llguidance"

    def __init__(self, grammar: LlamaGrammar, vocab: Any) -> None:
        self.grammar = grammar
        self._vocab = vocab
        self._info = info = vocab_info(vocab)
        for t in grammar.triggers:
            if t.kind == "token" and not 0 <= int(t.value) < info.n_vocab:
                raise GrammarError(f"token trigger {t.value} is out of range ({info.n_vocab} tokens)")
        self._proto = grammar.matcher(vocab)  # validates before any decoding; kept pristine for reset
        self._eog = set(info.eog.tolist())
        self._eog_words = (info.eog >> 5).astype(np.intp)
        self._eog_bits = (np.uint32(1) << (info.eog & 31).astype(np.uint32)).astype(np.uint32)
        self._mask = np.zeros((info.n_vocab + 31) // 32, dtype=np.int32)
        self.reset()

    # --- state ---

    def reset(self) -> None:
        self._matcher = self._proto.deep_copy()
        self._active = not self.grammar.triggers
        self._mask_ready = False
        self._buf = bytearray()  # lazy, inactive: the output so far
        self._pieces: list[tuple[int, int, int]] = []  # lazy, inactive: (token, start, end) in _buf
        self._history: list[int] = []  # every accepted token since reset
        self._consumed: list[int] = []  # tokens the matcher consumed for each accepted token
        self._activated_at = 0 if self._active else -1  # index into _history
        self._replayed = 0  # lazy: tokens fed to the grammar at activation

    def clone(self) -> GrammarSampler:
        c = copy.copy(self)
        c._matcher = self._matcher.deep_copy()
        c._mask = self._mask.copy()
        c._buf = bytearray(self._buf)
        c._pieces = list(self._pieces)
        c._history = list(self._history)
        c._consumed = list(self._consumed)
        return c

    @property
    def active(self) -> bool:
        """True while the grammar constrains (always, unless lazy and not yet triggered)."""
        return self._active

    def is_accepting(self) -> bool:
        """The output so far is a complete sentence of the grammar (True while a lazy grammar waits)."""
        if not self._active:
            return True
        return not self._matcher.is_error() and self._matcher.is_accepting()

    def is_finished(self) -> bool:
        """The grammar is complete and cannot be extended: generation should stop here."""
        return self._active and not self._matcher.is_error() and self._matcher.is_stopped()

    # --- sampling ---

    def allowed_mask(self) -> np.ndarray:
        """The current bitmask (int32 words, bit ``t % 32`` of word ``t // 32`` set if token t is allowed)."""
        if not self._mask_ready:
            m = self._matcher
            if m.is_error():
                raise GrammarError(f"grammar matcher failed: {m.get_error()[:1000]}")
            if m.is_stopped():
                self._mask.fill(0)
            else:
                m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
                if m.is_error():
                    raise GrammarError(f"grammar matcher failed computing the mask: {m.get_error()[:1000]}")
            words = self._mask.view(np.uint32)
            if m.is_accepting():
                np.bitwise_or.at(words, self._eog_words, self._eog_bits)
            else:
                np.bitwise_and.at(words, self._eog_words, ~self._eog_bits)
            self._mask_ready = True
        return self._mask

    def apply(self, cur: TokenDataArray) -> None:
        if not self._active:
            return
        mask = self.allowed_mask()
        logits = cur.mutable_logits()
        if cur.is_identity:
            _mask_all(logits, mask)
        else:
            _mask_ids(logits, np.ascontiguousarray(cur.ids, dtype=np.int32), mask, self._info.n_vocab)

    def accept(self, token: int) -> None:
        t = int(token)
        if not 0 <= t < self._info.n_vocab:
            raise GrammarError(f"token id {t} is out of range ({self._info.n_vocab} tokens)")
        if self._active:
            self._consumed.append(self._consume(t))
        else:
            self._watch(t)
            self._consumed.append(0)
        self._history.append(t)

    def rollback(self, n_tokens: int) -> None:
        """Undo the last ``n_tokens`` accepted tokens (for speculative decoding)."""
        n = int(n_tokens)
        if n < 0 or n > len(self._history):
            raise GrammarError(f"cannot roll back {n} tokens: {len(self._history)} accepted")
        if n == 0:
            return
        keep = len(self._history) - n
        if self._active and keep >= self._activated_at and self._activated_at >= 0:
            k = sum(self._consumed[keep:])
            if k == 0 or self._matcher.rollback(k):
                del self._history[keep:]
                del self._consumed[keep:]
                self._mask_ready = False
                return
        history = self._history[:keep]  # crosses the activation, or llguidance refused: replay
        self.reset()
        for t in history:
            self.accept(t)

    # --- internals ---

    def _piece(self, t: int) -> bytes:
        return bytes(self._vocab.token_to_piece(t, special=True))

    def _consume(self, t: int) -> int:
        """Feed one token to the matcher; the number of tokens it consumed (0 or 1)."""
        m = self._matcher
        if t in self._eog:
            if m.is_error() or not m.is_accepting():
                raise GrammarError(
                    f"end-of-generation token {t} ({self._piece(t)!r}) sampled while the grammar is not complete"
                )
            if m.is_stopped():
                return 0  # finished already; llguidance does not count a final EOS
            if not m.consume_token(t):
                raise GrammarError(
                    f"grammar matcher refused end-of-generation token {t}: {m.get_error()[:500]}"
                )
            self._mask_ready = False
            return 1
        if m.try_consume_tokens([t]) != 1:
            if m.is_error():
                why = f"the grammar matcher failed ({m.stop_reason()}): {m.get_error()[:500]}"
            elif m.is_stopped():
                why = "the grammar is finished"
            else:
                why = "the grammar does not allow it here"
            raise GrammarError(f"token {t} ({self._piece(t)!r}) is not allowed: {why}")
        self._mask_ready = False
        return 1

    def _watch(self, t: int) -> None:
        """Lazy and inactive: append the token's text and activate at the earliest trigger that fires."""
        piece = self._piece(t)
        start = len(self._buf)
        self._buf += piece
        self._pieces.append((t, start, len(self._buf)))
        fire: int | None = None
        text: str | None = None
        for trig in self.grammar.triggers:
            if trig.kind == "token":
                pos = start if t == trig.value else None
            elif trig.kind == "word":  # a new occurrence ends in this piece: search only the tail
                w = str(trig.value).encode("utf-8")
                i = self._buf.find(w, max(0, start - len(w) + 1))
                pos = i if i >= 0 else None
            else:
                if text is None:
                    text = self._buf.decode("utf-8", "surrogateescape")
                pos = self._find(trig.kind, str(trig.value), text)
            if pos is not None and (fire is None or pos < fire):
                fire = pos
        if fire is not None:
            self._activate(fire)

    @staticmethod
    def _find(kind: str, value: str, text: str) -> int | None:
        """Byte offset where a "pattern"/"pattern_full" trigger starts the grammar in ``text``, or None."""
        rx = compile_trigger(value)
        m = rx.search(text) if kind == "pattern" else rx.fullmatch(text)
        if m is None:
            return None
        i = m.start()
        for g in range(1, (rx.groups or 0) + 1):  # as llama.cpp: the first group that matched text
            if m.start(g) >= 0 and m.end(g) > m.start(g):
                i = m.start(g)
                break
        return len(text[:i].encode("utf-8", "surrogateescape"))

    def _activate(self, pos: int) -> None:
        self._active = True
        self._activated_at = len(self._history) + 1  # this token is in the replay, not rolled back alone
        m = self._matcher
        consumed = 0
        for t, s, e in self._pieces:
            if e <= pos:
                continue
            if s >= pos:
                if m.try_consume_tokens([t]) == 1:
                    consumed += 1
                    continue
                data = bytes(self._buf[s:e])
                alt = (
                    self._tokenize(data, parse_special=False)
                    if self._info.tokenizer.is_special_token(t)
                    else []
                )
            else:
                data = bytes(self._buf[pos:e])
                alt = self._tokenize(data, parse_special=True)
            k = m.try_consume_tokens(alt) if alt else 0
            consumed += k
            if k == len(alt) and alt:
                continue
            # stops matching inside this piece: feed what is left of it byte by byte, as far as it goes
            done = len(b"".join(self._piece(i) for i in alt[:k]))
            for b in data[done:]:
                bt = self._info.byte_tokens.get(b)
                if bt is None or m.try_consume_tokens([bt]) != 1:
                    break
                consumed += 1
            break
        self._buf = bytearray()
        self._pieces = []
        self._mask_ready = False
        self._replayed = consumed

    def _tokenize(self, data: bytes, parse_special: bool) -> list[int]:
        info = self._info
        return exact_tokenize(self._vocab, data, parse_special, info.tokenizer, info.byte_tokens)
