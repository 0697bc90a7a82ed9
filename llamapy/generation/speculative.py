"""Speculative decoding without a second model: prompt-lookup (n-gram) drafting, as llama-cpp-python's
``LlamaPromptLookupDecoding`` (``Llama(draft_model=LlamaPromptLookupDecoding(...))``).

A draft model here is anything called as ``draft(input_ids) -> token ids`` (llama-cpp-python's
``LlamaDraftModel``): ``input_ids`` are the tokens of the sequence so far (the prompt, what was
generated, and the token just sampled); it returns the tokens it guesses come next. :func:`generate`
(``llamapy.generation.loop``) evaluates the sampled token and the guesses in one batch with every row's
logits, then hands the rows one by one to :meth:`Generation.step`: a guess is kept while the sampler
picks it, and the cache is cut back after the first token that differs. Each token the caller gets was
sampled by the same sampler from the logits of exactly the tokens before it, so the output (greedy or
sampled, same seed) is what generation without a draft gives, with fewer decodes when the guesses
hold (up to kernel rounding: a batch of several rows may take other matrix kernels than one row).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import LlamapyError


class LlamaDraftModel:
    """A draft model: ``draft(input_ids) -> np.ndarray`` of guessed next tokens (llama-cpp-python's
    abstract base)."""

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        raise NotImplementedError


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Guess the continuation by finding the last ``max_ngram_size`` (then shorter) tokens earlier in the
    sequence and proposing the ``num_pred_tokens`` tokens that followed them there (its first
    occurrence), as llama-cpp-python's ``LlamaPromptLookupDecoding``."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        if int(max_ngram_size) < 1:
            raise ValueError(f"max_ngram_size must be at least 1, got {max_ngram_size}")
        if int(num_pred_tokens) < 0:
            raise ValueError(f"num_pred_tokens must be 0 or more, got {num_pred_tokens}")
        self.max_ngram_size = int(max_ngram_size)
        self.num_pred_tokens = int(num_pred_tokens)

    @staticmethod
    def find_candidate_pred_tokens(
        input_ids: np.ndarray, max_ngram_size: int, num_pred_tokens: int
    ) -> np.ndarray:
        input_ids = np.asarray(input_ids, dtype=np.intc).reshape(-1)
        n = input_ids.shape[0]
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(input_ids, (size,))
            matches = np.nonzero(np.all(windows == input_ids[-size:], axis=1))[0]
            for idx in matches:
                start = int(idx) + size
                end = min(start + num_pred_tokens, n)
                if start < end:
                    return input_ids[start:end]
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)


def draft_tokens(draft_model: object, context: Sequence[int], n_vocab: int, n_max: int) -> list[int]:
    """The draft model's guesses after ``context``: at most ``n_max``, cut before the first one that is
    not a token id of the vocabulary (a draft model is user code: its output is not trusted)."""
    if n_max <= 0:
        return []
    guess = draft_model(np.asarray(context, dtype=np.intc))  # type: ignore[operator]
    out: list[int] = []
    for t in np.asarray(guess).reshape(-1)[:n_max]:
        t = int(t)
        if not 0 <= t < n_vocab:
            break
        out.append(t)
    return out


# llama.cpp's --spec-type names this offers (besides a second model, ``-md``)
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "mtp", "draft-mtp")


def make_spec_draft(
    spec_type: str,
    model: object = None,
    *,
    n_draft: int | None = None,
    n_min: int = 0,
    p_min: float = 0.0,
    size_n: int | None = None,
    size_m: int | None = None,
    min_hits: int = 1,
    n_ctx: int = 4096,
    n_batch: int = 512,
    n_threads: int | None = None,
) -> LlamaDraftModel:
    """A draft for one sequence by llama.cpp's ``--spec-type`` name: ``ngram-simple`` / ``ngram-map-k``
    (:mod:`.ngram`; ``size_n`` key length, default 12, ``size_m`` draft length, default 48 or
    ``n_draft``) or ``mtp`` / ``draft-mtp`` (:mod:`.mtp`: ``model`` is the loaded target, whose MTP layer
    drafts ``n_draft`` tokens, default 3). Raises ``ValueError`` for an unknown name or bad parameters
    and :class:`~.mtp.MtpError` for MTP on a model without MTP layers."""
    from .ngram import NgramMapK, NgramSimple

    name = str(spec_type).strip().lower()
    if name in ("ngram-simple", "ngram-map-k"):
        cls = NgramSimple if name == "ngram-simple" else NgramMapK
        m = size_m if size_m is not None else (n_draft if n_draft is not None else 48)
        return cls(size_n if size_n is not None else 12, m, min_hits)
    if name in ("mtp", "draft-mtp"):
        from .mtp import MtpDraft

        if model is None:
            raise SpecTypeError(
                "--spec-type mtp drafts with the target model's MTP layer: it needs the model"
            )
        return MtpDraft(model, n_draft=n_draft or 3, n_min=n_min, p_min=p_min, n_ctx=n_ctx, n_batch=n_batch,
                        n_threads=n_threads)  # fmt: skip
    raise SpecTypeError(f"unknown speculative decoding type {spec_type!r} (one of: {', '.join(SPEC_TYPES)})")


class SpecTypeError(LlamapyError, ValueError):
    """A ``--spec-type`` name this does not offer."""
