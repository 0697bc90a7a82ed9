"""The generation loop: prompt -> decode -> sample -> piece -> text, and its text helpers.

Two small helpers are meant for reuse (the server uses them too):

- :class:`IncrementalDetokenizer` turns token ids into text one token at a time and never emits half a
  UTF-8 character (a character split over several byte tokens comes out once it is whole; invalid
  bytes become U+FFFD, exactly as decoding all the bytes at once would).
- :class:`StopStrings` holds text back while it could still be the start of a stop string, and cuts
  the output before the first stop string (the stop text itself is never emitted).

:class:`TokenSequence` keeps one sequence of a context's KV cache in step with a list of tokens
(prefix reuse, batched evaluation, context shifting), and :func:`generate` is the token loop over it.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .errors import LlamapyError
from .memory import ContextFullError  # (re-exported by llamapy.context; memory is the light import)

__all__ = [
    "ContextFullError",
    "GenerationError",
    "GenerationParams",
    "IncrementalDetokenizer",
    "PromptTooLongError",
    "Step",
    "StopStrings",
    "TokenSequence",
    "generate",
]


class GenerationError(LlamapyError):
    """Invalid generation input (bad stop strings, tokens out of range, ...)."""


class PromptTooLongError(ContextFullError, ValueError):
    """The prompt alone does not fit in the context."""


# ---------------------------------------------------------------------------------------------------
# text helpers


class _PieceSource(Protocol):
    def token_to_piece(self, token: int, special: bool = False) -> bytes: ...


class IncrementalDetokenizer:
    """Token ids -> text, one token at a time, never emitting an incomplete UTF-8 character.

    ``vocab`` is a :class:`llamapy.vocab.Vocab` (anything with ``token_to_piece(token, special)``) or a
    callable ``token -> bytes``. ``special=True`` renders special/control tokens as their text.

    >>> d = IncrementalDetokenizer(lambda t: [b"\\xe2\\x82", b"\\xac!"][t])
    >>> d.add(0), d.add(1), d.flush()
    ('', '€!', '')
    """

    def __init__(self, vocab: _PieceSource | Callable[[int], bytes], special: bool = False) -> None:
        if callable(vocab) and not hasattr(vocab, "token_to_piece"):
            self._piece: Callable[[int], bytes] = vocab
        else:
            self._piece = lambda t: vocab.token_to_piece(t, special)  # type: ignore[union-attr]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything emitted so far

    def add(self, token: int) -> str:
        """Append one token; return the newly completed text (possibly empty)."""
        return self.add_bytes(self._piece(int(token)))

    def add_bytes(self, piece: bytes) -> str:
        out = self._decoder.decode(piece, final=False)
        self.text += out
        return out

    def extend(self, tokens: Iterable[int]) -> str:
        return "".join(self.add(t) for t in tokens)

    @property
    def pending(self) -> bool:
        """True while bytes of an incomplete character are held back."""
        return bool(self._decoder.getstate()[0])

    def flush(self) -> str:
        """End of text: release held-back bytes (an incomplete character becomes U+FFFD)."""
        out = self._decoder.decode(b"", final=True)
        self.text += out
        return out

    def reset(self) -> None:
        self._decoder.reset()
        self.text = ""


class StopStrings:
    """Streams text while watching for stop strings.

    :meth:`feed` returns the text that can be emitted now: text that could still be the beginning of a
    stop string is held back until it either completes the stop string (then the output ends before
    it and :attr:`stopped` becomes True; of several, the one completed first wins, however the text
    was split) or can no longer match (then it is released). Call
    :meth:`flush` at the end of generation to release what is still held back.

    >>> s = StopStrings(["\\nUser:"])
    >>> s.feed("Hi!\\nUs"), s.feed("er: x"), s.stopped, s.matched
    ('Hi!', '', True, '\\nUser:')
    """

    def __init__(self, stop: str | Sequence[str] | None = None) -> None:
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        for s in stop:
            if not isinstance(s, str):
                raise GenerationError(f"stop strings must be str, got {type(s).__name__}: {s!r}")
        self.stops: list[str] = sorted({s for s in stop if s}, key=len)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    @property
    def held(self) -> str:
        """Text held back because it could still become a stop string."""
        return self._held

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        pending = self._held + text
        # the stop string that completes first, as if the text came one character at a time
        # (ties: the one that starts first, i.e. the longest)
        best, best_at, best_end = None, -1, -1
        for s in self.stops:
            at = pending.find(s)
            if at >= 0:
                end = at + len(s)
                if best is None or end < best_end or (end == best_end and at < best_at):
                    best, best_at, best_end = s, at, end
        if best is not None:
            self.stopped, self.matched, self._held = True, best, ""
            return pending[:best_at]
        keep = self._partial_suffix(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        longest = min(len(text), max(len(s) for s in self.stops) - 1)
        for k in range(longest, 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def flush(self) -> str:
        """End of generation without a stop string: release the held-back text."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out


# ---------------------------------------------------------------------------------------------------
# the KV cache of one sequence, kept in step with a token list


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class TokenSequence:
    """The tokens of one sequence of a :class:`llamapy.context.Context`, evaluated in batches.

    ``tokens`` always equals what the KV cache holds for ``seq_id`` at positions ``0..len-1``.
    With ``context_shift`` a full context drops the oldest half of the tokens after the first
    ``n_keep`` ones and shifts the rest down (as llama.cpp's ``--context-shift --keep N``);
    without it a full context raises :class:`ContextFullError`.
    """

    def __init__(
        self,
        ctx: Any,
        seq_id: int = 0,
        context_shift: bool = False,
        n_keep: int = 0,
        n_batch: int | None = None,
        batch_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.ctx = ctx
        self._batch_factory = batch_factory
        self.seq_id = seq_id
        self.context_shift = context_shift
        self.n_keep = n_keep
        self.n_batch = int(n_batch or ctx.n_batch)
        self.tokens: list[int] = []
        self.n_shifted = 0  # tokens dropped by context shifts so far
        self.logits_all = False  # request logits for every evaluated token (for on_logits)
        # called after each decoded chunk with (position of its first token, logits rows): every row
        # with logits_all, else only the last token's row (position of the last token)
        self.on_logits: Callable[[int, np.ndarray], None] | None = None
        self._last_logits: np.ndarray | None = None

    @property
    def n_ctx(self) -> int:
        return int(self.ctx.n_ctx)

    def __len__(self) -> int:
        return len(self.tokens)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix_length(self.tokens, tokens)

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` tokens in the cache."""
        n = max(0, min(n, len(self.tokens)))
        if n == len(self.tokens):
            return
        if not self.ctx.memory.seq_rm(self.seq_id, n, -1):
            self.ctx.memory.seq_rm(self.seq_id, -1, -1)
            keep, self.tokens = self.tokens[:n], []
            if keep:
                self.eval(keep)
            return
        del self.tokens[n:]
        self._last_logits = None

    def clear(self) -> None:
        self.ctx.memory.seq_rm(self.seq_id, -1, -1)
        self.tokens = []
        self._last_logits = None

    def shift(self) -> int:
        """Drop half of the tokens after ``n_keep`` and move the rest down; returns how many were dropped."""
        n_past = len(self.tokens)
        n_keep = min(max(self.n_keep, 0), n_past)
        n_discard = (n_past - n_keep) // 2
        if n_discard <= 0:
            raise ContextFullError(
                f"context full: {n_past} tokens in a context of {self.n_ctx}, and --keep {self.n_keep} "
                f"leaves nothing to shift out"
            )
        mem = self.ctx.memory
        mem.seq_rm(self.seq_id, n_keep, n_keep + n_discard)
        mem.seq_add(self.seq_id, n_keep + n_discard, n_past, -n_discard)
        del self.tokens[n_keep : n_keep + n_discard]
        self.n_shifted += n_discard
        return n_discard

    def eval(self, tokens: Sequence[int], logits_all: bool | None = None) -> np.ndarray:
        """Decode ``tokens`` after the ones already in the cache.

        Returns the logits of the last token (``[n_vocab]``), or with ``logits_all`` (default: the
        sequence's ``logits_all``) those of every token (``[len(tokens), n_vocab]``).
        """
        if logits_all is None:
            logits_all = self.logits_all
        make_batch = self._batch_factory
        if make_batch is None:
            from .batch import Batch

            make_batch = Batch.from_tokens
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise GenerationError("nothing to evaluate: the token list is empty")
        if len(tokens) > self.n_ctx:
            raise PromptTooLongError(
                f"{len(tokens)} tokens do not fit in the context of {self.n_ctx} tokens "
                f"(use a larger context, -c N, or a shorter prompt)"
            )
        rows: list[np.ndarray] = []
        i = 0
        while i < len(tokens):
            room = self.n_ctx - len(self.tokens)
            if room <= 0:
                if not self.context_shift:
                    raise ContextFullError(
                        f"context full: all {self.n_ctx} positions are used (use a larger context with -c N, "
                        f"or --context-shift)"
                    )
                self.shift()
                continue
            chunk = tokens[i : i + min(self.n_batch, room)]
            batch = make_batch(chunk, pos0=len(self.tokens), seq_id=self.seq_id, logits_all=logits_all)
            self.ctx.decode(batch)
            pos0 = len(self.tokens)
            self.tokens.extend(chunk)
            i += len(chunk)
            if logits_all:
                rows.append(np.array(self.ctx.get_logits()[: len(chunk)], dtype=np.float32))
                if self.on_logits is not None:
                    self.on_logits(pos0, rows[-1])
        self._last_logits = np.array(self.ctx.get_logits_ith(-1), dtype=np.float32)
        if self.on_logits is not None and not logits_all:
            self.on_logits(len(self.tokens) - 1, self._last_logits[None, :])
        return np.concatenate(rows) if logits_all else self._last_logits

    def logits(self) -> np.ndarray:
        """Logits after the last evaluated token."""
        if self._last_logits is None:
            if not self.tokens:
                raise GenerationError("no logits: nothing has been evaluated")
            last = self.tokens[-1]
            self.truncate(len(self.tokens) - 1)
            self.eval([last])
        assert self._last_logits is not None
        return self._last_logits

    def prefill(self, prompt: Sequence[int]) -> int:
        """Make the cache hold exactly ``prompt`` (reusing the common prefix) and leave its last
        logits ready; returns the number of tokens reused."""
        if not prompt:
            raise GenerationError("the prompt is empty (no tokens to start from)")
        if len(prompt) > self.n_ctx:
            raise PromptTooLongError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.n_ctx} "
                f"(use -c N with N > {len(prompt)}, or a shorter prompt)"
            )
        n = self.common_prefix(prompt)
        if n == len(prompt) == len(self.tokens) and self._last_logits is not None:
            return n  # already there, logits ready
        n = min(n, len(prompt) - 1)  # re-evaluate at least the last token for its logits
        self.truncate(n)
        self.eval(prompt[n:])
        return n


# ---------------------------------------------------------------------------------------------------
# the token loop


@dataclass
class GenerationParams:
    max_tokens: int = -1  # n_predict: -1 = until end of generation (or a full context)
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    special: bool = False  # render special tokens in the output text


@dataclass
class Step:
    """One step of :func:`generate`: the sampled token (None for the final flush), the text it
    released, and on the last step the finish reason (``"stop"`` or ``"length"``)."""

    token: int | None
    text: str
    finish_reason: str | None = None
    logits: np.ndarray | None = None  # the logits the token was sampled from


def _eog_ids(vocab: Any) -> np.ndarray:
    """The end-of-generation token ids of a vocabulary."""
    return np.array([t for t in range(vocab.n_tokens) if vocab.is_eog(t)], dtype=np.int64)


def generate(
    seq: TokenSequence,
    sample: Callable[[np.ndarray], int],
    vocab: Any,
    prompt: Sequence[int],
    params: GenerationParams | None = None,
    accept: Callable[[int], None] | None = None,
    stopping_criteria: Callable[[list[int], np.ndarray], bool] | None = None,
) -> Iterator[Step]:
    """Evaluate ``prompt`` and generate until end of generation, a stop string or ``max_tokens``.

    ``sample(logits) -> token`` picks the next token (e.g. a sampler chain's ``sample``) and
    ``accept(token)`` is told every generated token. ``stopping_criteria(tokens, logits)`` (tokens in
    the cache, the logits just sampled from) may end generation before a sampled token is used.
    Yields a :class:`Step` per token; the last step carries the finish reason. A full context raises
    :class:`ContextFullError` unless the sequence shifts its context.
    """
    p = params or GenerationParams()
    stops = StopStrings(p.stop)
    detok = IncrementalDetokenizer(vocab, special=p.special)
    seq.prefill(prompt)
    eog = _eog_ids(vocab) if p.ignore_eos else None
    n_gen = 0
    while True:
        if 0 <= p.max_tokens <= n_gen:
            reason = "length"
            break
        logits = seq.logits()
        if eog is not None and eog.size:
            logits = logits.copy()
            logits[eog] = -np.inf
        token = int(sample(logits))
        if stopping_criteria is not None and stopping_criteria(seq.tokens, logits):
            reason = "stop"
            break
        n_gen += 1
        if accept is not None:
            accept(token)
        if vocab.is_eog(token) and eog is None:
            reason = "stop"
            break
        text = stops.feed(detok.add(token))
        if stops.stopped:
            yield Step(token, text, "stop", logits)
            return
        yield Step(token, text, None, logits)
        if 0 <= p.max_tokens <= n_gen:
            reason = "length"
            break
        seq.eval([token])
    tail = stops.feed(detok.flush())
    if stops.stopped:
        reason = "stop"
    else:
        tail += stops.flush()
    yield Step(None, tail, reason)
