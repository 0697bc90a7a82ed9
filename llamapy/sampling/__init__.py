"""Samplers and the sampler chain, as llama.cpp's llama-sampler (``src/llama-sampler.cpp``) and
``common/sampling.cpp``.

Quick start::

    from llamapy.sampling import SamplingParams, build_chain
    chain = build_chain(SamplingParams(temp=0.0), n_vocab=n_vocab)   # greedy
    tok = chain.sample(logits); chain.accept(tok)
"""

from .chain import (
    DEFAULT_SAMPLERS,
    SAMPLER_CHARS,
    SamplerChain,
    SamplingParams,
    apply_samplers,
    build_chain,
    greedy_chain,
    sampler_chars,
    sampler_names,
)
from .dry import DRYSampler
from .errors import SamplingError
from .rng import LLAMA_DEFAULT_SEED, MT19937
from .samplers import (
    AdaptivePSampler,
    DistSampler,
    EmptySampler,
    GreedySampler,
    LogitBiasSampler,
    MinPSampler,
    MirostatSampler,
    MirostatV2Sampler,
    PenaltiesSampler,
    Sampler,
    TempExtSampler,
    TempSampler,
    TopKSampler,
    TopNSigmaSampler,
    TopPSampler,
    TypicalSampler,
    XTCSampler,
)
from .token_data import TokenDataArray

__all__ = [
    "AdaptivePSampler",
    "DEFAULT_SAMPLERS",
    "DRYSampler",
    "DistSampler",
    "EmptySampler",
    "GreedySampler",
    "LLAMA_DEFAULT_SEED",
    "LogitBiasSampler",
    "MT19937",
    "MinPSampler",
    "MirostatSampler",
    "MirostatV2Sampler",
    "PenaltiesSampler",
    "SAMPLER_CHARS",
    "Sampler",
    "SamplerChain",
    "SamplingError",
    "SamplingParams",
    "TempExtSampler",
    "TempSampler",
    "TokenDataArray",
    "TopKSampler",
    "TopNSigmaSampler",
    "TopPSampler",
    "TypicalSampler",
    "XTCSampler",
    "apply_samplers",
    "build_chain",
    "greedy_chain",
    "sampler_chars",
    "sampler_names",
]
