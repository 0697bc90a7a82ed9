"""Sampling for the server: the shared :mod:`llamapy.sampling` chain per request, plus the
log-probabilities reported to clients (those of the raw logits, as llama.cpp's server reports them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sampling import SAMPLER_CHARS, SamplerChain, SamplingError, SamplingParams, build_chain
from ..sampling import sampler_chars as _sampler_chars
from ..sampling import sampler_names as _sampler_names

__all__ = ["SamplingParams", "make_chain", "parse_samplers", "log_softmax", "top_logprobs"]


def parse_samplers(spec: list[str] | str) -> list[str]:
    """Names (``["top_k", "temperature"]`` or ``"top_k;temperature"``) or llama.cpp's letters
    (``"kt"``) -> canonical names; :class:`SamplingError` for unknown ones."""
    if isinstance(spec, str) and ";" not in spec and spec and set(spec) <= set(SAMPLER_CHARS.values()):
        return _sampler_chars(spec)
    return _sampler_names(spec)


def make_chain(params: SamplingParams, n_vocab: int, n_ctx: int, vocab: Any = None) -> SamplerChain:
    """The request's chain (``vocab`` is needed only for DRY's sequence breakers)."""
    return build_chain(params, n_vocab=n_vocab, vocab=vocab, n_ctx=n_ctx)


def check(params: SamplingParams) -> None:
    """Raise :class:`SamplingError` for values the chain refuses."""
    params.validate()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


def top_logprobs(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens as (id, logprob), most likely first."""
    if n <= 0:
        return []
    n = min(n, logprobs.size)
    idx = np.argpartition(-logprobs, n - 1)[:n]
    idx = idx[np.argsort(-logprobs[idx], kind="stable")]
    return [(int(i), float(logprobs[i])) for i in idx]


SamplingError = SamplingError
