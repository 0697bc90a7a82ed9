"""The sampler chain, llama.cpp's common sampling parameters, and ``build_chain`` (common_sampler_init).

Usage::

    chain = build_chain(SamplingParams(temp=0.7, seed=42), n_vocab=model.n_vocab, vocab=model.vocab)
    token = chain.sample(ctx.get_logits_ith(-1))   # does not accept: call accept() with the token used
    chain.accept(token)
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .._dataclass import dataclass
from .dry import MAX_BREAKERS, MAX_CHAR_LEN, DRYSampler
from .errors import SamplingError
from .rng import LLAMA_DEFAULT_SEED
from .samplers import (
    AdaptivePSampler,
    DistSampler,
    EmptySampler,
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

F32_MAX = float(np.finfo(np.float32).max)
MAX_SAMPLERS = 32  # names in a sampler sequence (there are 12 kinds; repeats are allowed)
# canonical names (llama.cpp's common_sampler_type_to_str) and their --sampling-seq letters
SAMPLER_CHARS = {
    "dry": "d",
    "top_k": "k",
    "typ_p": "y",
    "top_p": "p",
    "top_n_sigma": "s",
    "min_p": "m",
    "temperature": "t",
    "xtc": "x",
    "penalties": "e",
    "adaptive_p": "a",
}
DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)


def _aliases() -> dict[str, str]:
    out = {}
    for name in SAMPLER_CHARS:
        out[name] = name
        out[name.replace("_", "-")] = name
        out[name.replace("_", "")] = name
    out.update({"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical": "typ_p"})
    return out


_ALIASES = _aliases()


def sampler_names(names: str | Iterable[str]) -> list[str]:
    """Canonical sampler names from ``--samplers`` (a ';'-separated string or a list; case-insensitive,
    kebab-case and llama.cpp's aliases accepted). Unknown names raise ``SamplingError``."""
    items = names.split(";") if isinstance(names, str) else list(names)
    out = []
    for raw in items:
        key = raw.strip().lower()
        if not key:
            continue
        if key not in _ALIASES:
            raise SamplingError(
                f"unknown sampler name {raw!r}; known: {', '.join(SAMPLER_CHARS)} (or nucleus, temp, typ)"
            )
        out.append(_ALIASES[key])
    return out


def sampler_chars(chars: str) -> list[str]:
    """Canonical sampler names from ``--sampling-seq`` letters (e.g. ``"edskypmxt"``)."""
    by_char = {c: n for n, c in SAMPLER_CHARS.items()}
    out = []
    for i, c in enumerate(chars):
        if c not in by_char:
            raise SamplingError(
                f"unknown sampler letter {c!r} at position {i} of {chars!r}; known: {''.join(by_char)}"
            )
        out.append(by_char[c])
    return out


@dataclass
class SamplingParams:
    """llama.cpp's ``common_params_sampling`` with its defaults."""

    seed: int = LLAMA_DEFAULT_SEED  # LLAMA_DEFAULT_SEED (0xFFFFFFFF) = a random seed
    n_prev: int = 64
    n_probs: int = 0
    min_keep: int = 0
    top_k: int = 40  # <= 0: disabled
    top_p: float = 0.95  # 1.0: disabled
    min_p: float = 0.05  # 0.0: disabled
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10  # > 0.5 disables XTC
    typ_p: float = 1.0
    temp: float = 0.80  # <= 0: greedy
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64  # -1: context size
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # -1: context size
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.90
    mirostat: int = 0  # 0 off, 1 mirostat, 2 mirostat 2.0
    top_n_sigma: float = -1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    ignore_eos: bool = False
    dry_sequence_breakers: list[str] = dataclasses.field(default_factory=lambda: ["\n", ":", '"', "*"])
    samplers: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    logit_bias: dict[int, float] = dataclasses.field(default_factory=dict)

    def validate(self) -> None:
        """Refuse values llama.cpp refuses (and a few it would silently misuse)."""
        pr = float(self.penalty_repeat)
        if not math.isfinite(pr) or pr <= 0 or not math.isfinite(1.0 / pr):
            raise SamplingError(
                f"penalty_repeat must be finite and greater than 0, got {self.penalty_repeat}"
            )
        for name in (
            "penalty_freq",
            "penalty_present",
            "top_p",
            "min_p",
            "typ_p",
            "temp",
            "dynatemp_range",
            "dynatemp_exponent",
            "xtc_probability",
            "xtc_threshold",
            "dry_multiplier",
            "dry_base",
            "top_n_sigma",
            "mirostat_tau",
            "mirostat_eta",
        ):
            v = float(getattr(self, name))
            if not math.isfinite(v) or abs(v) > F32_MAX:  # the samplers compute in float32
                raise SamplingError(f"{name} must be finite (a 32-bit float), got {v}")
        if 2.0 * self.mirostat_tau > F32_MAX:  # mirostat starts from mu = 2 * tau
            raise SamplingError(f"mirostat_tau must be at most {F32_MAX / 2:g}, got {self.mirostat_tau}")
        if self.temp + self.dynatemp_range > F32_MAX:
            raise SamplingError(
                f"temp + dynatemp_range must be a finite 32-bit float, got {self.temp + self.dynatemp_range}"
            )
        breakers = self.dry_sequence_breakers
        if len(breakers) > MAX_BREAKERS:
            raise SamplingError(
                f"at most {MAX_BREAKERS} dry_sequence_breakers are allowed, got {len(breakers)}"
            )
        for i, b in enumerate(breakers):
            if not isinstance(b, str):
                raise SamplingError(f"dry_sequence_breakers[{i}] must be a string, got {b!r}")
            if len(b.encode("utf-8", "surrogatepass")) > MAX_CHAR_LEN:
                raise SamplingError(
                    f"dry_sequence_breakers[{i}] is {len(b.encode('utf-8', 'surrogatepass'))} bytes long; "
                    f"the limit is {MAX_CHAR_LEN} (UTF-8)"
                )
        if self.mirostat not in (0, 1, 2):
            raise SamplingError(f"mirostat must be 0, 1 or 2, got {self.mirostat}")
        n = len(sampler_names(self.samplers))
        if n > MAX_SAMPLERS:  # each one runs at every step
            raise SamplingError(f"at most {MAX_SAMPLERS} samplers are allowed, got {n}")

    def print(self) -> str:
        """The parameter summary llama.cpp logs."""
        return (
            f"\trepeat_last_n = {self.penalty_last_n}, repeat_penalty = {self.penalty_repeat:.3f}, "
            f"frequency_penalty = {self.penalty_freq:.3f}, presence_penalty = {self.penalty_present:.3f}\n"
            f"\tdry_multiplier = {self.dry_multiplier:.3f}, dry_base = {self.dry_base:.3f}, "
            f"dry_allowed_length = {self.dry_allowed_length}, dry_penalty_last_n = {self.dry_penalty_last_n}\n"
            f"\ttop_k = {self.top_k}, top_p = {self.top_p:.3f}, min_p = {self.min_p:.3f}, "
            f"xtc_probability = {self.xtc_probability:.3f}, xtc_threshold = {self.xtc_threshold:.3f}, "
            f"typical_p = {self.typ_p:.3f}, top_n_sigma = {self.top_n_sigma:.3f}, temp = {self.temp:.3f}\n"
            f"\tmirostat = {self.mirostat}, mirostat_lr = {self.mirostat_eta:.3f}, "
            f"mirostat_ent = {self.mirostat_tau:.3f}"
        )


class SamplerChain(Sampler):
    """Samplers applied in order to the candidates; the last one must select a token.

    ``SamplerChain(params, n_vocab=..., vocab=..., n_ctx=...)`` builds llama.cpp's chain from
    ``SamplingParams`` (see ``build_chain``); ``SamplerChain()`` starts empty for ``add``.
    """

    name = "chain"

    def __init__(
        self,
        params: SamplingParams | None = None,
        *,
        n_vocab: int | None = None,
        vocab: Any = None,
        n_ctx: int | None = None,
        seed: int | None = None,
        grammar: Sampler | None = None,
    ) -> None:
        self.samplers: list[Sampler] = []
        self.params = params
        self.n_vocab = n_vocab
        self.n_sample = 0
        self.cur: TokenDataArray | None = None  # the candidates of the last sample()
        self.grammar: Sampler | None = None  # the grammar sampler, which sees generated tokens only
        if params is not None:
            for s in _chain_samplers(params, n_vocab, vocab, n_ctx, seed):
                self.add(s)
        if grammar is not None:
            self.set_grammar(grammar)

    def set_grammar(self, grammar: Sampler | None) -> None:
        """Put a grammar sampler after logit bias, penalties and DRY, before the first sampler that
        truncates or selects (as llama-cpp-python orders it): it sees every candidate. It replaces the
        chain's grammar, if any (None removes it)."""
        if self.grammar is not None:
            self.samplers.remove(self.grammar)
            self.grammar = None
        if grammar is None:
            return
        at = 0
        while at < len(self.samplers) and _before_grammar(self.samplers[at]):
            at += 1
        self.samplers.insert(at, grammar)
        self.grammar = grammar

    def accept_prompt(self, tokens: Iterable[int]) -> None:
        """Let the samplers see prompt tokens (penalties, DRY); the grammar only constrains the output."""
        others = [s for s in self.samplers if s is not self.grammar]
        for t in tokens:
            for s in others:
                s.accept(int(t))

    def add(self, sampler: Sampler) -> SamplerChain:
        if not isinstance(sampler, Sampler):
            raise SamplingError(f"SamplerChain.add expects a Sampler, got {type(sampler).__name__}")
        self.samplers.append(sampler)
        return self

    def __len__(self) -> int:
        return len(self.samplers)

    def __getitem__(self, i: int) -> Sampler:
        return self.samplers[i]

    def remove(self, i: int) -> Sampler:
        return self.samplers.pop(i)

    def apply(self, cur: TokenDataArray) -> None:
        for s in self.samplers:
            s.apply(cur)

    def accept(self, token: int) -> None:
        for s in self.samplers:
            s.accept(token)
        self.n_sample += 1

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()

    def clone(self) -> SamplerChain:
        other = SamplerChain.__new__(SamplerChain)
        other.samplers = [s.clone() for s in self.samplers]
        other.grammar = next(
            (c for s, c in zip(self.samplers, other.samplers, strict=True) if s is self.grammar), None
        )
        other.params = copy.deepcopy(self.params)
        other.n_vocab = self.n_vocab
        other.n_sample = self.n_sample
        other.cur = None if self.cur is None else self.cur.copy()
        return other

    def sample(self, logits: np.ndarray, idx: int = -1, *, accept: bool = False) -> int:
        """Sample one token from ``logits`` (one row, or a 2-D array and the row ``idx``).

        Does not accept the token unless ``accept=True`` (common_sampler_sample style): call ``accept``
        with the token that is actually used. ``self.cur`` keeps the final candidates (probabilities
        for ``n_probs``/logprobs)."""
        arr = np.asarray(logits)
        if arr.ndim == 2:
            try:
                arr = arr[idx]
            except IndexError:
                raise SamplingError(f"logits row {idx} out of range for {arr.shape[0]} rows") from None
        cur = TokenDataArray.from_logits(arr, self.n_vocab)
        self.apply(cur)
        if not 0 <= cur.selected < cur.size:
            raise SamplingError(
                f"the sampler chain [{self.describe()}] selected no token "
                f"({cur.size} candidates left): end the chain with dist, greedy or mirostat"
            )
        self.cur = cur
        token = int(cur.ids[cur.selected])
        if accept:
            self.accept(token)
        return token

    def describe(self) -> str:
        """llama.cpp's ``common_sampler_print``: ``logits -> top-k -> ...``."""
        return "logits " + "".join(f"-> {s.name} " for s in self.samplers)

    @property
    def seed(self) -> int | None:
        """The seed in effect of the last seeded sampler (llama_sampler_get_seed)."""
        for s in reversed(self.samplers):
            if hasattr(s, "seed_cur"):
                return s.seed_cur
        return None


def _before_grammar(s: Sampler) -> bool:
    """Samplers that only adjust logits (a grammar goes after them; "?penalties"/"?dry" are disabled ones)."""
    return isinstance(s, LogitBiasSampler | PenaltiesSampler | DRYSampler) or (
        isinstance(s, EmptySampler) and s.name in ("?penalties", "?dry")
    )


def _eog_bias(vocab: Any, n_vocab: int | None) -> dict[int, float]:
    from ..vocab.vocab import eog_ids

    n = int(n_vocab if n_vocab is not None else vocab.n_tokens)
    return {int(t): -math.inf for t in eog_ids(vocab) if t < n}


def _chain_samplers(
    params: SamplingParams, n_vocab: int | None, vocab: Any, n_ctx: int | None, seed: int | None
) -> list[Sampler]:
    params.validate()
    seed = params.seed if seed is None else seed
    if n_vocab is None and vocab is not None:
        n_vocab = int(vocab.n_tokens)

    def last_n(v: int, enabled: bool = True) -> int:
        if v == -1 and enabled:
            if n_ctx is None:
                raise SamplingError("a last_n of -1 means the context size: pass n_ctx to build the chain")
            return int(n_ctx)
        return max(int(v), 0)

    out: list[Sampler] = []
    bias = dict(params.logit_bias)
    if params.ignore_eos:
        if vocab is None:
            raise SamplingError(
                "ignore_eos needs the vocabulary (vocab=...) to know the end-of-generation tokens"
            )
        bias.update(_eog_bias(vocab, n_vocab))
    if bias:
        out.append(LogitBiasSampler(n_vocab, bias))

    if params.mirostat == 0:
        use_adaptive = False
        # name -> (whether it acts, the sampler, the placeholder's name where it does not)
        simple: dict[str, tuple[Callable[[], bool], Callable[[], Sampler], str]] = {
            "dry": (
                lambda: (
                    params.dry_multiplier != 0.0 and params.dry_base >= 1.0 and params.dry_penalty_last_n != 0
                ),
                lambda: DRYSampler(
                    params.dry_multiplier,
                    params.dry_base,
                    params.dry_allowed_length,
                    last_n(params.dry_penalty_last_n, params.dry_multiplier != 0.0),
                    params.dry_sequence_breakers,
                    vocab,
                ),
                "?dry",
            ),
            "top_k": (lambda: params.top_k > 0, lambda: TopKSampler(params.top_k), "?top-k"),
            "top_p": (
                lambda: params.top_p < 1.0,
                lambda: TopPSampler(params.top_p, params.min_keep),
                "?top-p",
            ),
            "top_n_sigma": (
                lambda: params.top_n_sigma > 0,
                lambda: TopNSigmaSampler(params.top_n_sigma),
                "?top-n-sigma",
            ),
            "min_p": (lambda: params.min_p > 0, lambda: MinPSampler(params.min_p, params.min_keep), "?min-p"),
            "xtc": (
                lambda: not (params.xtc_probability <= 0 or params.xtc_threshold > 0.5),
                lambda: XTCSampler(params.xtc_probability, params.xtc_threshold, params.min_keep, seed),
                "?xtc",
            ),
            "typ_p": (
                lambda: params.typ_p < 1.0,
                lambda: TypicalSampler(params.typ_p, params.min_keep),
                "?typical",
            ),
            "temperature": (
                lambda: not (params.temp == 1.0 and params.dynatemp_range <= 0),
                lambda: TempExtSampler(params.temp, params.dynatemp_range, params.dynatemp_exponent),
                "?temp-ext",
            ),
        }
        for name in sampler_names(params.samplers):
            if name in simple:
                on, make, placeholder = simple[name]
                out.append(make() if on() else EmptySampler(placeholder))
            elif name == "penalties":
                pen_on = not (
                    params.penalty_repeat == 1.0
                    and params.penalty_freq == 0.0
                    and params.penalty_present == 0.0
                )
                pen = PenaltiesSampler(
                    last_n(params.penalty_last_n, pen_on),
                    params.penalty_repeat,
                    params.penalty_freq,
                    params.penalty_present,
                )
                out.append(EmptySampler("?penalties") if pen.disabled else pen)
            elif name == "adaptive_p":
                use_adaptive = True
        if use_adaptive:
            out.append(AdaptivePSampler(params.adaptive_target, params.adaptive_decay, seed))
        else:
            out.append(DistSampler(seed))
    elif params.mirostat == 1:
        if n_vocab is None:
            raise SamplingError("mirostat 1 needs n_vocab")
        out.append(TempSampler(params.temp))
        out.append(MirostatSampler(n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100))
    else:
        out.append(TempSampler(params.temp))
        out.append(MirostatV2Sampler(seed, params.mirostat_tau, params.mirostat_eta))
    return out


def build_chain(
    params: SamplingParams | None = None,
    n_vocab: int | None = None,
    seed: int | None = None,
    vocab: Any = None,
    n_ctx: int | None = None,
    grammar: Sampler | None = None,
) -> SamplerChain:
    """The chain llama.cpp's ``common_sampler_init`` builds: logit bias (plus end-of-generation bans
    with ``ignore_eos``), the samplers of ``params.samplers`` in order, then dist (or mirostat).

    ``seed`` overrides ``params.seed``; ``vocab`` (``n_tokens``, ``token_to_piece``, ``tokenize``,
    ``is_eog``) is needed for DRY's sequence breakers and ``ignore_eos``; ``n_ctx`` resolves last_n = -1;
    ``grammar`` (a :class:`llamapy.grammar.GrammarSampler`) goes after logit bias and penalties.
    """
    return SamplerChain(
        params or SamplingParams(), n_vocab=n_vocab, vocab=vocab, n_ctx=n_ctx, seed=seed, grammar=grammar
    )


def greedy_chain() -> SamplerChain:
    """A chain that always picks the highest logit (``llama_sampler_init_greedy``)."""
    from .samplers import GreedySampler

    return SamplerChain().add(GreedySampler())


def apply_samplers(cur: TokenDataArray, samplers: Sequence[Sampler]) -> TokenDataArray:
    """Apply ``samplers`` in order to ``cur`` (a test and tooling convenience)."""
    for s in samplers:
        s.apply(cur)
    return cur
