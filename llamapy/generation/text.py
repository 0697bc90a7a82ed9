"""Text out of tokens: :class:`IncrementalDetokenizer` (never half a UTF-8 character),
:class:`StopStrings` (hold back what may still become a stop string, cut before the first one) and
:class:`LineLimits` (llama-server's indentation and time stops)."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ..errors import LlamapyError


class GenerationError(LlamapyError):
    """Invalid generation input (bad stop strings, tokens out of range, ...)."""


class _PieceSource(Protocol):
    def token_to_piece(self, token: int, special: bool = False) -> bytes: ...


class IncrementalDetokenizer:
    """Token ids -> text, one token at a time, never emitting an incomplete UTF-8 character.

    ``vocab`` is a :class:`llamapy.vocab.Vocab` (anything with ``token_to_piece(token, special)``) or a
    callable ``token -> bytes``. ``special=True`` renders special/control tokens as their text;
    ``preserved`` renders just those token ids as text (a chat format's ``<tool_call>``, ``<think>``).

    >>> d = IncrementalDetokenizer(lambda t: [b"\\xe2\\x82", b"\\xac!"][t])
    >>> d.add(0), d.add(1), d.flush()
    ('', '€!', '')
    """

    def __init__(
        self,
        vocab: _PieceSource | Callable[[int], bytes],
        special: bool = False,
        preserved: Iterable[int] = (),
    ) -> None:
        if callable(vocab) and not hasattr(vocab, "token_to_piece"):
            self._piece: Callable[[int], bytes] = vocab
        else:
            keep = frozenset(int(t) for t in preserved)
            if keep and not special:
                self._piece = lambda t: vocab.token_to_piece(t, t in keep)  # type: ignore[union-attr]
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


class LineLimits:
    """llama-server's two line-based stops (``n_indent``, ``t_max_predict_ms``; code completion clients
    such as llama.vim send them): after the first newline, a line whose first character other than a
    space or a tab comes after fewer than ``n_indent`` of them ends the generation, the text cut just
    before that character; and once a newline has been generated, a piece of text with a newline ends it
    when more than ``t_max_predict_ms`` have passed since the generation started. :meth:`feed` returns
    the text to keep and whether to stop; 0 turns either limit off."""

    def __init__(
        self, n_indent: int = 0, t_max_predict_ms: float = 0, clock: Callable[[], float] | None = None
    ) -> None:
        self.n_indent = n_indent
        self.t_max_s = t_max_predict_ms / 1000.0
        self.clock = clock or time.perf_counter
        self.t0: float | None = None
        self._indent: int | None = (
            None  # spaces/tabs so far at the start of the current line, after a newline
        )

    def start(self) -> None:
        """The generation's first token is being sampled (the time limit counts from here)."""
        if self.t0 is None:
            self.t0 = self.clock()

    def feed(self, text: str) -> tuple[str, bool]:
        if self.n_indent > 0:
            for i, c in enumerate(text):
                if self._indent is not None:
                    if c in " \t":
                        self._indent += 1
                        continue
                    if self._indent < self.n_indent:
                        return text[:i], True
                    self._indent = None
                if c == "\n":
                    self._indent = 0
        if (
            self.t_max_s > 0
            and "\n" in text
            and self.t0 is not None
            and self.clock() - self.t0 > self.t_max_s
        ):
            return text, True
        return text, False
