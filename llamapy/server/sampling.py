"""Sampling for the server: the shared :mod:`llamapy.sampling` chain per request."""

from __future__ import annotations

from typing import Any

from ..sampling import SAMPLER_CHARS, SamplerChain, SamplingError, SamplingParams, build_chain
from ..sampling import sampler_chars as _sampler_chars
from ..sampling import sampler_names as _sampler_names

__all__ = ["SamplingParams", "make_chain", "parse_samplers", "prepare_dry"]


def parse_samplers(spec: list[str] | str) -> list[str]:
    """Names (``["top_k", "temperature"]`` or ``"top_k;temperature"``) or llama.cpp's letters
    (``"kt"``) -> canonical names; :class:`SamplingError` for unknown ones."""
    if isinstance(spec, str) and ";" not in spec and spec and set(spec) <= set(SAMPLER_CHARS.values()):
        return _sampler_chars(spec)
    return _sampler_names(spec)


def make_chain(
    params: SamplingParams, n_vocab: int, n_ctx: int, vocab: Any = None, grammar: Any = None
) -> SamplerChain:
    """The request's chain (``vocab`` is needed only for DRY's sequence breakers; ``grammar`` is a
    grammar sampler placed after logit bias and penalties)."""
    return build_chain(params, n_vocab=n_vocab, vocab=vocab, n_ctx=n_ctx, grammar=grammar)


def prepare_dry(params: SamplingParams, vocab: Any) -> None:
    """Turn DRY's sequence breakers into token sequences now (on a request thread) when the chain will
    use them, so that the engine thread finds them cached instead of building them between steps."""
    from ..sampling.dry import cached_breakers

    on = params.dry_multiplier != 0.0 and params.dry_base >= 1.0 and params.dry_penalty_last_n != 0
    if on and vocab is not None and params.mirostat == 0 and params.dry_sequence_breakers:
        if "dry" in _sampler_names(params.samplers):
            cached_breakers(vocab, list(params.dry_sequence_breakers))


def check(params: SamplingParams) -> None:
    """Raise :class:`SamplingError` for values the chain refuses."""
    params.validate()


SamplingError = SamplingError
