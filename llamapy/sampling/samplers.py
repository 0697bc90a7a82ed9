"""The samplers of llama.cpp's ``src/llama-sampler.cpp``, vectorized over the candidates with NumPy.

Each sampler has ``apply(cur)`` (edit a ``TokenDataArray`` in place), ``accept(token)`` (see the chosen
token), ``reset()`` and ``clone()``. Arithmetic is float32 where llama.cpp's is, so thresholds decide
the same way. Ties between equal logits are broken by position (lower token id first on a fresh array).
"""

from __future__ import annotations

import copy
import math
from collections import deque

import numpy as np

from .errors import SamplingError
from .kernels import dist_select, mass_candidates, sigma_stats, sort_desc_indices
from .rng import MT19937, resolve_seed
from .token_data import TokenDataArray

_F32 = np.float32


def _logf(x: np.ndarray) -> np.ndarray:
    """float32 log, correctly rounded (C's ``logf``; NumPy's own float32 log is off by an ulp on ~22 %)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(x, dtype=np.float64)).astype(_F32)


def _log2f(x: np.ndarray | float) -> np.ndarray:
    """float32 log2, correctly rounded (C's ``log2f``)."""
    with np.errstate(divide="ignore"):
        return np.log2(np.asarray(x, dtype=np.float64)).astype(_F32)


def _sum_f32(x: np.ndarray) -> np.float32:
    """A running float32 sum in order (C's loop), where ``sum`` would add pairwise."""
    return np.cumsum(x, dtype=_F32)[-1] if len(x) else _F32(0)


class Sampler:
    """Base class: a no-op sampler named ``name``."""

    name = "empty"

    def apply(self, cur: TokenDataArray) -> None:
        pass

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def clone(self) -> Sampler:
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class EmptySampler(Sampler):
    """A disabled sampler (llama.cpp names these ``?top-k`` etc.)."""

    def __init__(self, name: str) -> None:
        self.name = name


class GreedySampler(Sampler):
    name = "greedy"

    def apply(self, cur: TokenDataArray) -> None:
        if cur.size == 0:
            cur.selected = -1
            return
        cur.selected = int(np.argmax(cur.logits))


class _Seeded(Sampler):
    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.seed_cur = resolve_seed(seed)
        self._rng = MT19937(self.seed_cur)

    def reset(self) -> None:
        self.seed_cur = resolve_seed(self.seed)
        self._rng.seed(self.seed_cur)


class DistSampler(_Seeded):
    """Softmax, then one draw (``uniform_real_distribution<double>``) over the running sum."""

    name = "dist"

    def apply(self, cur: TokenDataArray) -> None:
        n = cur.size
        if n == 0:
            cur.selected = -1
            return
        cur.selected = 0
        if n == 1:
            self._rng.uniform_double()  # one draw per sample, whatever the size
            cur.p = np.ones(1, dtype=_F32)
            return
        lg = np.ascontiguousarray(cur.logits)
        max_l = lg[0] if cur.sorted else lg.max()
        if not math.isfinite(max_l):
            raise SamplingError(
                f"dist: cannot sample, the largest of the {n} candidate logits is {max_l} "
                "(every token banned, or an infinite logit)"
            )
        rnd = self._rng.uniform_double()
        p = np.empty(n, dtype=_F32)
        sel, _total = dist_select(lg, _F32(max_l), rnd, p)
        cur.selected = int(sel) if sel >= 0 else n - 1
        cur.p = p


class TopKSampler(Sampler):
    name = "top-k"

    def __init__(self, k: int) -> None:
        self.k = int(k)

    def apply(self, cur: TokenDataArray) -> None:
        top_k_impl(cur, self.k)


def top_k_impl(cur: TokenDataArray, k: int) -> None:
    if k <= 0:
        return
    k = min(k, cur.size)
    cur.partial_sort(k)


class _Mass(Sampler):
    """A sampler over probability mass ``p`` that keeps at least ``min_keep`` tokens."""

    def __init__(self, p: float, min_keep: int = 0) -> None:
        self.p = float(p)
        self.min_keep = int(min_keep)


class TopPSampler(_Mass):
    name = "top-p"

    def apply(self, cur: TokenDataArray) -> None:
        if _F32(self.p) >= 1.0 or cur.size == 0:
            return
        cur.softmax(False)
        n = cur.size
        if cur.sorted:
            cur.truncate(self._last_idx(cur.p, n, partial=False))
            return
        # as llama.cpp: try the top 256 first; then, instead of sorting the whole vocabulary, sort the
        # tokens a logit histogram says carry the mass (with a margin), and sort everything only if
        # the exact float32 running sum still falls short
        if n > 1024:
            order = cur.top_indices(min(256, n))
            last = self._last_idx(cur.p[order], n, partial=True)
            if last < 0:
                order = mass_candidates(cur.logits, cur.p, min(float(_F32(self.p)) + 1e-3, 1.0))
                last = self._last_idx(cur.p[order], n, partial=len(order) < n)
        else:
            last = -1
        if last < 0:
            order = cur.top_indices(n)
            last = self._last_idx(cur.p[order], n, partial=False)
        cur.take(order[:last], True)

    def _last_idx(self, probs: np.ndarray, n: int, partial: bool) -> int:
        cs = np.cumsum(probs, dtype=_F32)
        ok = (cs >= _F32(self.p)) & (np.arange(1, len(probs) + 1) >= self.min_keep)
        hit = np.flatnonzero(ok)
        if len(hit):
            return int(hit[0]) + 1
        return -1 if partial else n


class MinPSampler(_Mass):
    name = "min-p"

    def apply(self, cur: TokenDataArray) -> None:
        if _F32(self.p) <= 0 or cur.size == 0:
            return
        log_p = _F32(math.log(_F32(self.p)))
        if not cur.sorted:
            min_logit = _F32(cur.logits.max() + log_p)
            keep = np.flatnonzero(cur.logits >= min_logit)
            if len(keep) and len(keep) >= self.min_keep:
                if len(keep) < cur.size:
                    identity = cur.is_identity and len(keep) == keep[-1] + 1
                    cur.take(keep, False)
                    cur.is_identity = identity
                return
            cur.sort_desc()
        min_logit = _F32(cur.logits[0] + log_p)
        below = (cur.logits < min_logit) & (np.arange(cur.size) >= self.min_keep)
        below[0] = False
        hit = np.flatnonzero(below)
        cur.truncate(int(hit[0]) if len(hit) else cur.size)


class TypicalSampler(_Mass):
    name = "typical"

    def apply(self, cur: TokenDataArray) -> None:
        if _F32(self.p) >= 1.0 or cur.size == 0:
            return
        cur.softmax(True)
        logp = _logf(cur.p)
        with np.errstate(invalid="ignore"):  # p == 0 adds nothing (llama.cpp's 0 * -inf gives NaN)
            entropy = _sum_f32(np.where(cur.p > 0, -cur.p * logp, _F32(0)))
            shifted = np.abs(-logp - entropy)
        order = sort_desc_indices(-shifted)  # ascending shifted score, stable
        cs = np.cumsum(cur.p[order], dtype=_F32)
        i = np.arange(len(order))
        ok = (cs > _F32(self.p)) & ((self.min_keep == 0) | (i >= self.min_keep - 1))
        hit = np.flatnonzero(ok)
        last = int(hit[0]) + 1 if len(hit) else len(order)
        cur.take(order[:last], False)


class TempSampler(Sampler):
    name = "temp"

    def __init__(self, temp: float) -> None:
        self.temp = float(temp)

    def apply(self, cur: TokenDataArray) -> None:
        cur.apply_temp(self.temp)


class TempExtSampler(Sampler):
    """Dynamic temperature from the normalized entropy (``delta > 0``); plain temperature otherwise."""

    name = "temp-ext"

    def __init__(self, temp: float, delta: float = 0.0, exponent: float = 1.0) -> None:
        self.temp = float(temp)
        self.delta = float(delta)
        self.exponent = float(exponent)

    def apply(self, cur: TokenDataArray) -> None:
        if _F32(self.delta) <= 0:
            cur.apply_temp(self.temp)
            return
        if cur.size <= 1:
            return
        min_temp = max(_F32(0), _F32(self.temp) - _F32(self.delta))
        max_temp = _F32(self.temp) + _F32(self.delta)
        max_entropy = -_F32(math.log(_F32(1.0) / _F32(cur.size)))
        cur.softmax(True)
        pos = cur.p[cur.p > 0]
        entropy = -_sum_f32(pos * _logf(pos))  # (0 - a) - b ... in float is -(a + b + ...)
        norm_entropy = _F32(entropy / max_entropy)
        dyn_temp = _F32(min_temp + (max_temp - min_temp) * _F32(norm_entropy ** _F32(self.exponent)))
        cur.apply_temp(float(dyn_temp))
        lg = cur.logits.astype(np.float64)
        with np.errstate(invalid="ignore"):
            p = np.exp(lg - lg[0])
        # each p stored as float, then divided by the double running sum
        cur.p = (p.astype(_F32).astype(np.float64) / np.cumsum(p)[-1]).astype(_F32)


class XTCSampler(_Seeded):
    """Exclude top choices: with probability ``probability``, drop every token above ``threshold`` but
    the least likely of them."""

    name = "xtc"

    def __init__(self, probability: float, threshold: float, min_keep: int = 0, seed: int | None = None):
        super().__init__(seed)
        self.probability = float(probability)
        self.threshold = float(threshold)
        self.min_keep = int(min_keep)

    def apply(self, cur: TokenDataArray) -> None:
        if _F32(self.probability) <= 0 or _F32(self.threshold) > 0.5 or cur.size < 2:
            return
        if self._rng.uniform_float() > _F32(self.probability):
            return
        cur.softmax(True)
        above = cur.p >= _F32(self.threshold)
        below = np.flatnonzero(~above)
        run = int(below[0]) if len(below) else cur.size  # leading tokens at or above the threshold
        pos_last = max(run - 1, 0)
        if cur.size - pos_last >= self.min_keep and pos_last > 0:
            cur.drop_front(pos_last)


class TopNSigmaSampler(Sampler):
    """Keep tokens whose logit is within ``n`` standard deviations of the maximum."""

    name = "top-n-sigma"

    def __init__(self, n: float) -> None:
        self.n = float(n)

    def apply(self, cur: TokenDataArray) -> None:
        if _F32(self.n) <= 0 or cur.size <= 1:
            return
        lg = cur.logits
        mx, _, std = sigma_stats(np.ascontiguousarray(lg, dtype=_F32))
        cut = _F32(mx - _F32(self.n) * std)
        cur.logits = np.where(lg < cut, _F32(-np.inf), lg).astype(_F32)


class MirostatSampler(_Seeded):
    """Mirostat 1.0: estimate Zipf's exponent from the top ``m`` tokens, pick k so the surprise is ``tau``."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: int | None, tau: float, eta: float, m: int = 100) -> None:
        super().__init__(seed)
        self.n_vocab = int(n_vocab)
        self.tau = float(tau)
        self.eta = float(eta)
        self.m = int(m)
        self.mu = float(_F32(2.0) * _F32(tau))

    def apply(self, cur: TokenDataArray) -> None:
        cur.softmax(True)  # sorted first, as llama.cpp (the sum of the softmax in that order)
        # m <= 0: llama.cpp's size_t(m - 1) wraps around, every candidate counts
        n = cur.size - 1 if self.m <= 0 else min(self.m - 1, cur.size - 1)
        top = cur.p[: n + 1]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            i = np.arange(n, dtype=_F32)
            t = _logf((i + 2) / (i + 1))
            b = _logf(top[:n] / top[1 : n + 1])
            s_hat = _F32(_sum_f32(t * b) / _sum_f32(t * t))
            eps = _F32(s_hat - 1)
            k = _F32((eps * _F32(2.0) ** _F32(self.mu)) / (_F32(1) - _F32(self.n_vocab) ** -eps)) ** _F32(
                1 / s_hat
            )
        # int(k) of a non-finite or huge value is INT_MIN on x86, so max(.., 1) gives 1
        ki = int(k) if math.isfinite(k) and k < 2**31 else 1
        top_k_impl(cur, max(ki, 1))
        cur.softmax(True)
        idx = self._rng.discrete(cur.p)
        cur.selected = idx
        self._update(cur.p[idx])

    def _update(self, p: float) -> None:
        surprise = -_log2f(p)
        self.mu = float(_F32(_F32(self.mu) - _F32(self.eta) * _F32(surprise - _F32(self.tau))))

    def reset(self) -> None:
        self.mu = float(_F32(2.0) * _F32(self.tau))
        super().reset()


class MirostatV2Sampler(MirostatSampler):
    """Mirostat 2.0: drop tokens whose surprise exceeds ``mu``, sample, move ``mu`` toward ``tau``."""

    name = "mirostat-v2"

    def __init__(self, seed: int | None, tau: float, eta: float) -> None:
        super().__init__(0, seed, tau, eta)

    def apply(self, cur: TokenDataArray) -> None:
        # llama.cpp sorts (its softmax sums in that order), then cuts at the first surprise above mu
        cur.softmax(True)
        over = np.flatnonzero(-_log2f(cur.p) > _F32(self.mu))
        cur.truncate(max(int(over[0]) if len(over) else cur.size, 1))
        cur.softmax(True)
        idx = self._rng.discrete(cur.p)
        cur.selected = idx
        self._update(cur.p[idx])


class PenaltiesSampler(Sampler):
    """Repeat (divide positive / multiply negative logits), frequency and presence penalties over the
    last ``penalty_last_n`` accepted tokens."""

    name = "penalties"

    def __init__(
        self, penalty_last_n: int, penalty_repeat: float, penalty_freq: float, penalty_present: float
    ) -> None:
        self.penalty_last_n = max(int(penalty_last_n), 0)
        self.penalty_repeat = float(penalty_repeat)
        self.penalty_freq = float(penalty_freq)
        self.penalty_present = float(penalty_present)
        self._prev: deque[int] = deque(maxlen=max(self.penalty_last_n, 1))
        self._count: dict[int, int] = {}

    @property
    def disabled(self) -> bool:
        return self.penalty_last_n == 0 or (
            self.penalty_repeat == 1.0 and self.penalty_freq == 0.0 and self.penalty_present == 0.0
        )

    def accept(self, token: int) -> None:
        if self.penalty_last_n == 0:
            return
        token = int(token)
        self._count[token] = self._count.get(token, 0) + 1
        if len(self._prev) >= self.penalty_last_n:
            old = self._prev[0]
            c = self._count[old] - 1
            if c == 0:
                del self._count[old]
            else:
                self._count[old] = c
        self._prev.append(token)

    def apply(self, cur: TokenDataArray) -> None:
        if self.disabled or not self._count:
            return
        toks = np.fromiter(self._count.keys(), dtype=np.int64, count=len(self._count))
        cnts = np.fromiter(self._count.values(), dtype=np.int64, count=len(self._count))
        pos, which = cur.positions_of(toks)
        if len(pos) == 0:
            return
        lg = cur.logits[pos]
        rep = _F32(self.penalty_repeat)
        lg = np.where(lg <= 0, lg * rep, lg / rep).astype(_F32)
        c = cnts[which].astype(_F32)
        lg = lg - (c * _F32(self.penalty_freq) + (c > 0).astype(_F32) * _F32(self.penalty_present))
        cur.mutable_logits()[pos] = lg
        cur.sorted = False

    def reset(self) -> None:
        self._prev.clear()
        self._count.clear()


class LogitBiasSampler(Sampler):
    """Add a bias to given tokens' logits (``-inf`` bans a token)."""

    name = "logit-bias"

    def __init__(self, n_vocab: int | None, logit_bias: dict[int, float] | list[tuple[int, float]]) -> None:
        items = list(logit_bias.items()) if isinstance(logit_bias, dict) else list(logit_bias)
        for tok, bias in items:
            if not isinstance(tok, (int, np.integer)) or tok < 0 or (n_vocab is not None and tok >= n_vocab):
                raise SamplingError(f"logit_bias: token {tok!r} is not a token id in [0, {n_vocab})")
            if math.isnan(float(bias)):
                raise SamplingError(f"logit_bias: bias for token {tok} is NaN")
        self.n_vocab = n_vocab
        self.logit_bias = [(int(t), float(b)) for t, b in items]
        self._tokens = np.array([t for t, _ in self.logit_bias], dtype=np.int64)
        self._bias = np.array([b for _, b in self.logit_bias], dtype=_F32)

    def apply(self, cur: TokenDataArray) -> None:
        if not self.logit_bias:
            return
        # llama.cpp: every entry whose token sits at its own index is added there (a token listed twice
        # gets both biases); each other candidate gets the first of the remaining entries for its token
        ids, tok = cur.ids, self._tokens
        direct = tok < len(ids)
        direct[direct] = ids[tok[direct]] == tok[direct]
        lg = cur.mutable_logits()
        np.add.at(lg, tok[direct], self._bias[direct])
        if not direct.all():
            pos, which = cur.positions_of(tok[~direct])
            np.add.at(lg, pos, self._bias[~direct][which])


class AdaptivePSampler(_Seeded):
    """Adaptive-p: pick tokens near a target probability, adapted by an EMA of chosen probabilities."""

    name = "adaptive-p"
    _WIDTH_INV = _F32(1.0) / _F32(0.3)

    def __init__(self, target: float, decay: float, seed: int | None) -> None:
        super().__init__(seed)
        self.target = float(target)
        self.decay = float(min(max(_F32(decay), _F32(0)), _F32(0.99)))
        self._orig: np.ndarray = np.zeros(0, dtype=_F32)
        self._init_ema()

    def _init_ema(self) -> None:
        d = _F32(self.decay)
        self.weighted_sum = float(_F32(self.target) / (_F32(1) - d))
        self.total_weight = float(_F32(1) / (_F32(1) - d))
        self._pending: tuple[int, int] | None = None

    def apply(self, cur: TokenDataArray) -> None:
        cur.softmax(False)
        if self.target < 0:
            cur.selected = self._rng.discrete(cur.p)
            return
        self._orig = cur.p.copy()
        target = min(max(_F32(self.target), _F32(0)), _F32(1))
        adapted = (
            target
            if self.total_weight == 0
            else _F32(2) * target - _F32(self.weighted_sum) / _F32(self.total_weight)
        )
        adapted = min(max(_F32(adapted), _F32(0)), _F32(1))
        dist = np.abs((cur.p - adapted) * self._WIDTH_INV)
        new = (_F32(5.0) - _F32(10.0) * dist * dist / (_F32(1) + dist)).astype(_F32)
        cur.logits = np.where(cur.logits == -np.inf, cur.logits, new).astype(_F32)
        cur.softmax(False)
        idx = self._rng.discrete(cur.p)
        cur.selected = idx
        self._pending = (int(cur.ids[idx]), idx)

    def accept(self, token: int) -> None:
        if self._pending is not None and self._pending[0] == token:
            d = _F32(self.decay)
            self.weighted_sum = float(_F32(self._orig[self._pending[1]]) + d * _F32(self.weighted_sum))
            self.total_weight = float(_F32(1) + d * _F32(self.total_weight))
        self._pending = None

    def reset(self) -> None:
        self._init_ema()
        super().reset()
