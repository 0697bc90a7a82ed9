"""Speculative decoding with a second, smaller model (llama.cpp's ``--model-draft`` / ``-md``):
:class:`LlamaModelDraft` is a draft model in the ``draft(input_ids) -> token ids`` sense of
:mod:`.speculative`, so :func:`~.loop.generate` (the API) verifies its guesses like any other draft's.

It keeps its own context with the tokens it has seen; each call re-uses the common prefix with the
sequence it is given (``seq_rm`` of the rest), evaluates what is new, then drafts greedily as llama.cpp's
``common_speculative_gen_draft``: up to ``n_draft`` tokens, stopping before the first whose probability
among the draft's top 10 is under ``p_min``; fewer than ``n_min`` guesses are dropped (llama-server's
``--draft-min``). The draft must share the target's vocabulary (:func:`check_compatible`, as llama.cpp's
``common_speculative_are_compatible``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import LlamapyError
from .speculative import LlamaDraftModel

# llama.cpp's limits (common/speculative.cpp)
VOCAB_SIZE_MAX_DIFF = 128
VOCAB_CHECK_START = 5
TOP_K = 10  # the draft's sampler: top-k 10, probabilities among those


def confident_top(logits: Any, p_min: float) -> int | None:
    """The draft's next token from one row of logits: the best of the top ``TOP_K``, or None when its
    probability among those is below ``p_min`` (the draft stops there)."""
    logits = np.asarray(logits, dtype=np.float64)
    top = np.argpartition(-logits, min(TOP_K, len(logits) - 1))[:TOP_K]
    best = int(top[np.argmax(logits[top])])
    p = np.exp(logits[top] - logits[best])
    return None if p.max() / p.sum() < p_min else best


class DraftModelError(LlamapyError):
    """A draft model that cannot draft for this target (another vocabulary, bad parameters)."""


class LlamaModelDraft(LlamaDraftModel):
    """Draft with the GGUF model at ``model_path`` (or a loaded ``llamapy.model.Model``)."""

    def __init__(
        self,
        model: str | os.PathLike | Any,
        n_draft: int = 16,
        n_min: int = 0,
        p_min: float = 0.75,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        rope: Mapping[str, Any] | None = None,
    ) -> None:
        """``rope``: :class:`llamapy.context.ContextParams`' RoPE fields for the draft's context: the target's,
        as llama.cpp's draft context takes the main one's parameters (``common_base_params_to_speculative``)."""
        from ..context import Context, ContextParams
        from ..model import Model

        if int(n_draft) < 1 or int(n_min) < 0 or int(n_min) > int(n_draft):
            raise DraftModelError(f"need 1 <= n_draft and 0 <= n_min <= n_draft, got {n_draft}, {n_min}")
        if not 0.0 <= float(p_min) <= 1.0:
            raise DraftModelError(f"p_min must be between 0 and 1, got {p_min}")
        self.n_draft, self.n_min, self.p_min = int(n_draft), int(n_min), float(p_min)
        self.model = model if hasattr(model, "impl") else Model.load(os.fspath(model))
        params = ContextParams(
            **(rope or {}), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512), n_threads=n_threads
        )
        self.ctx = Context(self.model, params)
        self.tokens: list[int] = []  # exactly what the draft's cache holds
        self.n_drafted = 0
        self.n_calls = 0

    @property
    def vocab(self) -> Any:
        return self.model.vocab

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        from ..batch import Batch

        ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        self.n_calls += 1
        n_vocab = int(self.model.n_vocab)
        if not ids or len(ids) + self.n_draft >= self.ctx.n_ctx or any(not 0 <= t < n_vocab for t in ids):
            return np.zeros(0, dtype=np.intc)  # no room (or a token the draft does not know): no guess
        n = 0
        for a, b in zip(self.tokens, ids, strict=False):
            if a != b:
                break
            n += 1
        n = min(n, len(ids) - 1)  # evaluate at least the last token, for its logits
        if not self.ctx.memory.seq_rm(0, n, -1):  # a recurrent draft cannot drop a tail: start over
            self.ctx.memory.seq_rm(0, -1, -1)
            n = 0
        del self.tokens[n:]
        rest = ids[n:]
        for i in range(0, len(rest), self.ctx.n_batch):
            chunk = rest[i : i + self.ctx.n_batch]
            self.ctx.decode(Batch.from_tokens(chunk, pos0=n + i, seq_id=0, logits_all=False))
        self.tokens.extend(rest)
        out: list[int] = []
        while True:
            best = confident_top(self.ctx.get_logits()[-1], self.p_min)
            if best is None:
                break
            out.append(best)
            if len(out) >= self.n_draft:
                break
            self.ctx.decode(Batch.from_tokens([best], pos0=len(self.tokens), seq_id=0))
            self.tokens.append(best)
        if len(out) < self.n_min:
            out = []
        self.n_drafted += len(out)
        return np.asarray(out, dtype=np.intc)


def check_compatible(target_vocab: Any, draft_vocab: Any) -> None:
    """Raise :class:`DraftModelError` unless the draft's tokens mean what the target's do (same tokenizer
    type and special tokens, vocabulary sizes within 128, the same token texts on the shared ids)."""
    t, d = target_vocab, draft_vocab
    if t is None or d is None:
        raise DraftModelError("the target and the draft model both need a vocabulary")
    if getattr(t, "type", None) != getattr(d, "type", None):
        raise DraftModelError(f"the draft model's tokenizer ({d.type}) is not the target's ({t.type})")
    for name in ("bos", "eos"):
        if getattr(t, name, -1) != getattr(d, name, -1):
            raise DraftModelError(
                f"the draft model's {name.upper()} token ({getattr(d, name)}) is not the target's "
                f"({getattr(t, name)})"
            )
    nt, nd = int(t.n_tokens), int(d.n_tokens)
    if abs(nt - nd) > VOCAB_SIZE_MAX_DIFF:
        raise DraftModelError(
            f"the draft model's vocabulary ({nd} tokens) differs from the target's ({nt}) by more than "
            f"{VOCAB_SIZE_MAX_DIFF}"
        )
    for i in range(VOCAB_CHECK_START, min(nt, nd)):
        if t.token_text(i) != d.token_text(i):
            raise DraftModelError(
                f"token {i} is {d.token_text(i)!r} in the draft model and {t.token_text(i)!r} in the target"
            )


__all__ = ["DraftModelError", "LlamaModelDraft", "check_compatible"]
