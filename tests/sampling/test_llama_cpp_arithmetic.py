"""Where llamapy's samplers follow llama.cpp's float arithmetic and edge cases to the bit (found by
``benchmarks/samplers_vs_llamacpp.py``, the differential fuzz against libllama's samplers)."""

from __future__ import annotations

import math

import numpy as np

from llamapy.sampling import (
    DRYSampler,
    LogitBiasSampler,
    MirostatSampler,
    TempExtSampler,
    TempSampler,
    TokenDataArray,
    TopNSigmaSampler,
    TypicalSampler,
)

F = np.float32


def _arr(logits: list[float], ids: list[int] | None = None) -> TokenDataArray:
    lg = np.array(logits, dtype=F)
    return TokenDataArray(np.arange(len(lg)) if ids is None else np.array(ids), lg)


def _seq_entropy(p: np.ndarray) -> np.float32:
    e = F(0)
    for v in p:
        if v > 0:
            e = F(e - F(v * F(math.log(float(v)))))
    return e


def test_logit_bias_token_listed_twice_at_its_own_index() -> None:
    # token 0 sits at index 0: both of its entries are added there; token 6 is searched for
    cur = _arr([9, 10], ids=[0, 6])
    LogitBiasSampler(None, [(0, -5.0), (0, 0.5), (6, -0.5)]).apply(cur)
    np.testing.assert_array_equal(cur.logits, np.array([4.5, 9.5], dtype=F))
    # a searched-for token listed twice: only its first entry (llama.cpp's break)
    cur = _arr([9, 10], ids=[3, 6])
    LogitBiasSampler(None, [(6, -1.0), (6, -2.0)]).apply(cur)
    np.testing.assert_array_equal(cur.logits, np.array([9, 9], dtype=F))


def test_temp_ext_entropy_is_a_running_float_sum() -> None:
    lg = [0.2, 1.1, -1.3, -0.7, -0.8, -1.7, 0.1, 0.5]
    ref = _arr(lg)
    ref.softmax(True)
    ent = _seq_entropy(ref.p)
    t = F(F(0.0) + F(2.0) * F(F(ent / F(-math.log(F(1.0) / F(len(lg))))) ** F(1.0)))
    cur = _arr(lg)
    TempExtSampler(1.0, 1.0, 1.0).apply(cur)
    assert cur.logits[1] == F(ref.logits[1] / t)  # llama.cpp 0.3.36: 0.29628321528


def test_temp_ext_tiny_delta_is_plain_temperature() -> None:
    a, b = _arr([0.5, 2, 1]), _arr([0.5, 2, 1])
    TempExtSampler(-1.0, 1e-50).apply(a)  # delta rounds to 0.0f: llama.cpp's plain temperature
    TempSampler(-1.0).apply(b)
    np.testing.assert_array_equal(a.logits, b.logits)
    assert a.sorted == b.sorted


def test_top_n_sigma_on_logits_ulps_apart() -> None:
    lg = [
        -3.2974498,
        -3.2974498,
        -3.2974491,
        -3.2974501,
        -3.2974494,
        -3.2974496,
        -3.2974503,
        -3.2974501,
        -3.2974498,
    ]
    cur = _arr(lg)
    TopNSigmaSampler(1.5).apply(cur)
    assert int(np.isfinite(cur.logits).sum()) == 6  # llama.cpp 0.3.36 keeps 6


def test_typical_logs_are_correctly_rounded() -> None:
    rng = np.random.default_rng(8)  # a case where NumPy's float32 log and a pairwise sum keep one more
    n = int(rng.integers(1000, 20000))
    lg = rng.normal(0, float(rng.choice([1, 2, 3])), n).astype(F)
    cur = _arr(list(lg))
    TypicalSampler(0.95, 1).apply(cur)
    ref = _arr(list(lg))
    ref.softmax(True)
    ent = _seq_entropy(ref.p)
    shifted = np.array([abs(F(-F(math.log(float(v))) - ent)) for v in ref.p], dtype=F)
    cs = np.cumsum(ref.p[np.argsort(shifted, kind="stable")], dtype=F)
    assert cur.size == int(np.flatnonzero(cs > F(0.95))[0]) + 1 == 12303


def test_mirostat_m_at_most_zero_counts_every_candidate() -> None:
    lg = list(-np.log(np.arange(1, 200, dtype=np.float64)) * 1.2)
    for m in (0, -1):
        cur = _arr(lg)
        MirostatSampler(1000, 1, tau=5.0, eta=0.1, m=m).apply(cur)  # was a ValueError for m = -1
        assert cur.selected is not None and 0 <= cur.selected < cur.size


def test_dry_base_compared_as_float() -> None:
    assert DRYSampler(0.8, 0.99999999, 2, 64).enabled  # 0.99999999f == 1.0f
    assert not DRYSampler(0.8, 0.9999, 2, 64).enabled
