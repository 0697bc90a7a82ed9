"""The KV cache of one sequence kept in step with a token list (:class:`TokenSequence`): prefix
reuse, batched evaluation, context shifting."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..memory import ContextFullError  # (re-exported by llamapy.context; memory is the light import)
from .text import GenerationError


class PromptTooLongError(ContextFullError, ValueError):
    """The prompt alone does not fit in the context."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def context_shift_plan(n_past: int, n_keep: int, n_discard: int = 0) -> tuple[int, int]:
    """The context shift of a sequence holding ``n_past`` tokens: ``(n_keep, n_discard)``, the tokens
    kept at the start and how many after them are dropped (the rest then moves down by ``n_discard``),
    as llama.cpp's ``--context-shift --keep N`` (``n_discard`` 0: half of what follows ``n_keep``).

    Every value is clamped into range here, whatever the caller passed (llama.cpp's unchecked
    ``n_discard`` from a request body is a known out-of-bounds bug class): ``n_keep`` into
    ``[0, n_past]``, ``n_discard`` into ``[1, n_past - n_keep]``. Raises :class:`ContextFullError`
    when nothing can be dropped (``n_keep`` covers everything but at most one token).
    """
    n_past = max(int(n_past), 0)
    n_keep = min(max(int(n_keep), 0), n_past)
    n_left = n_past - n_keep
    n_discard = int(n_discard)
    n_discard = min(n_discard, n_left) if n_discard > 0 else n_left // 2
    if n_discard <= 0:
        raise ContextFullError(
            f"context full: {n_past} tokens, and --keep {n_keep} (n_keep) leaves nothing to shift out"
        )
    return n_keep, n_discard


# prompt-cache checkpoints of a recurrent state (llama-server's context checkpoints): taken this many
# tokens before the end of an evaluated prompt, so that the next request of a conversation, whose
# template re-renders the end of the last turn, can resume from one instead of from the start
CHECKPOINT_OFFSETS = (64, 4)


def checkpoint_positions(n_cached: int, n_prompt: int) -> list[int]:
    """Token counts after which to checkpoint a prompt of ``n_prompt`` tokens evaluated from
    ``n_cached`` on (ascending; each leaves at least one prompt token to evaluate after it)."""
    return sorted({n_prompt - k for k in CHECKPOINT_OFFSETS if n_cached < n_prompt - k})


def truncate_prompt(prompt: Sequence[int], n_ctx: int, n_keep: int) -> list[int]:
    """A prompt of ``n_ctx`` tokens or more cut to fit with room to generate, as llama-server did with
    ``--context-shift``: the first ``n_keep`` tokens (clamped to ``n_ctx - 4``, at least 0), then the end
    of the prompt, dropping whole blocks of ``(n_ctx - n_keep) // 2`` tokens after ``n_keep``; the result
    has fewer than ``n_ctx`` tokens. A prompt that fits is returned as it is."""
    prompt = list(prompt)
    if len(prompt) < n_ctx:
        return prompt
    if n_ctx < 4:
        raise PromptTooLongError(f"a context of {n_ctx} tokens is too small to truncate a prompt into")
    n_keep = min(max(int(n_keep), 0), n_ctx - 4)
    block = (n_ctx - n_keep) // 2
    erased = (len(prompt) - n_keep - block) // block
    return prompt[:n_keep] + prompt[n_keep + erased * block :]


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
        self.n_reused = 0  # prompt tokens the last prefill took from the cache
        # called after each decoded chunk with (position of its first token, its tokens, their normed
        # hidden states), every token an output; (-1, [], None) after a context shift (an MTP draft)
        self._hidden_tap: Callable[[int, list[int], np.ndarray | None], None] | None = None

    def set_hidden_tap(self, tap: Callable[[int, list[int], np.ndarray | None], None] | None) -> None:
        """Report the hidden state of every evaluated token to ``tap`` (None: stop). Turns the
        context's embeddings output on (the normed last hidden state, which the head reads)."""
        if tap is not None and not self.ctx.embeddings:
            self.ctx.embeddings = True
            self.ctx._graphs.clear()  # graphs built without the embeddings output
        self._hidden_tap = tap

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
        mem = self.ctx.memory
        if not mem.seq_rm(self.seq_id, n, -1):
            # a recurrent state goes back only to a checkpoint (or to the start): from there, re-evaluate
            q = int(getattr(mem, "seq_pos_restorable", lambda s, p: 0)(self.seq_id, n))
            if not 0 < q <= n or not mem.seq_rm(self.seq_id, q, -1):
                mem.seq_rm(self.seq_id, -1, -1)
                q = 0
            keep, self.tokens = self.tokens[q:n], self.tokens[:q]
            self._last_logits = None
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
        n_keep, n_discard = context_shift_plan(n_past, self.n_keep)
        mem = self.ctx.memory
        if not mem.seq_rm(self.seq_id, n_keep, n_keep + n_discard):
            raise ContextFullError(
                f"the context of {self.n_ctx} tokens is full and this model's memory cannot drop tokens "
                "from the middle (a recurrent state, or a window that no longer holds them): no context "
                "shift is possible; use a larger context (-c N)"
            )
        mem.seq_add(self.seq_id, n_keep + n_discard, n_past, -n_discard)
        del self.tokens[n_keep : n_keep + n_discard]
        self.n_shifted += n_discard
        if self._hidden_tap is not None:
            self._hidden_tap(-1, [], None)
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
            from ..batch import Batch

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
            tap = self._hidden_tap
            batch = make_batch(
                chunk, pos0=len(self.tokens), seq_id=self.seq_id, logits_all=logits_all or tap is not None
            )
            self.ctx.decode(batch)
            pos0 = len(self.tokens)
            self.tokens.extend(chunk)
            i += len(chunk)
            if tap is not None:
                tap(pos0, chunk, self.ctx.get_embeddings()[: len(chunk)])
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
        mem = self.ctx.memory
        if n < len(self.tokens):  # a recurrent state goes back only to a checkpoint
            n = min(n, int(getattr(mem, "seq_pos_restorable", lambda s, p: p)(self.seq_id, n)))
        self.truncate(n)
        done = n
        if getattr(mem, "has_checkpoints", False):
            for c in checkpoint_positions(n, len(prompt)):
                self.eval(prompt[done:c])
                mem.checkpoint(self.seq_id)
                done = c
        self.eval(prompt[done:])
        self.n_reused = n
        return n
