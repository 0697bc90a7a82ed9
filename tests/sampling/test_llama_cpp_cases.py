"""The cases of llama.cpp's tests/test-sampling.cpp, probabilities within 1e-5."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llamapy.sampling import (
    DistSampler,
    DRYSampler,
    MinPSampler,
    PenaltiesSampler,
    TempExtSampler,
    TempSampler,
    TokenDataArray,
    TopKSampler,
    TopNSigmaSampler,
    TopPSampler,
    TypicalSampler,
    XTCSampler,
)

P4 = [0.1, 0.2, 0.3, 0.4]


def make_tester(probs: list[float]) -> TokenDataArray:
    """sampler_tester(probs, ...): logits = logf(p), p = probs, in token order."""
    p = np.array(probs, dtype=np.float32)
    with np.errstate(divide="ignore"):
        logits = np.log(p)
    return TokenDataArray(np.arange(len(p)), logits, p.copy())


def check(cur: TokenDataArray, expected: list[float]) -> None:
    assert cur.size == len(expected), (cur.p, expected)
    np.testing.assert_allclose(cur.p, np.array(expected, dtype=np.float32), rtol=0, atol=1e-5)


def run(probs, samplers, expected):
    cur = make_tester(probs)
    for s in samplers:
        s.apply(cur)
    check(cur, expected)
    return cur


def sample_dist(sampler: DistSampler, logits: list[float]) -> int:
    cur = TokenDataArray(np.arange(len(logits)), np.array(logits, dtype=np.float32))
    sampler.apply(cur)
    assert 0 <= cur.selected < cur.size
    return int(cur.ids[cur.selected])


def test_dist_singleton_rng():
    singleton, control = DistSampler(4242), DistSampler(4242)
    sample_dist(singleton, [0.0])
    sample_dist(control, [0.0, 0.0])
    logits = [0.0] * 256
    for _ in range(4):
        assert sample_dist(singleton, logits) == sample_dist(control, logits)


@pytest.mark.parametrize("temp,expected", [(1.0, P4), (0.0, [0, 0, 0, 1.0])])
def test_temp(temp, expected):
    run(P4, [TempSampler(temp), DistSampler(0)], expected)


@pytest.mark.parametrize("temp,expected", [(1.0, P4), (0.0, [0, 0, 0, 1.0])])
def test_temp_ext(temp, expected):
    run(P4, [TempExtSampler(temp, 0.0, 1.0), DistSampler(0)], expected)


@pytest.mark.parametrize(
    "k,expected",
    [(1, [1.0]), (3, [0.44444, 0.33333, 0.22222]), (4, [0.4, 0.3, 0.2, 0.1]), (0, P4)],
)
def test_top_k(k, expected):
    run(P4, [TopKSampler(k), DistSampler(0)], expected)


@pytest.mark.parametrize(
    "p,expected",
    [(0.0, [1.0]), (0.7, [0.571429, 0.428571]), (0.8, [0.44444, 0.33333, 0.22222]), (1.0, P4)],
)
def test_top_p(p, expected):
    run(P4, [TopPSampler(p, 0), DistSampler(0)], expected)


@pytest.mark.parametrize(
    "p,expected",
    [
        (0.00, P4),
        (0.24, P4),
        (0.26, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (0.49, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (0.51, [0.3 / 0.7, 0.4 / 0.7]),
        (0.74, [0.3 / 0.7, 0.4 / 0.7]),
        (0.76, [1.0]),
        (1.00, [1.0]),
        (1.05, [1.0]),
    ],
)
def test_min_p(p, expected):
    run(P4, [MinPSampler(p, 0), DistSampler(0)], expected)


@pytest.mark.parametrize(
    "p,t,expected",
    [
        (0.99, 0.09, [0.1]),
        (0.99, 0.19, [0.2, 0.1]),
        (0.99, 0.29, [0.3, 0.2, 0.1]),
        (0.99, 0.39, [0.4, 0.3, 0.2, 0.1]),  # should not
    ],
)
def test_xtc(p, t, expected):
    run([0.4, 0.3, 0.2, 0.1], [XTCSampler(p, t, 0, 0)], expected)


@pytest.mark.parametrize(
    "probs,p,expected",
    [([0.97, 0.01, 0.01, 0.01], 0.5, [0.97]), ([0.4, 0.2, 0.2, 0.2], 0.5, [0.2, 0.2, 0.2])],
)
def test_typical(probs, p, expected):
    run(probs, [TypicalSampler(p, 0)], expected)


@pytest.mark.parametrize(
    "last,expected,rep,freq,pres",
    [
        ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
        ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
        ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
    ],
)
def test_penalties(last, expected, rep, freq, pres):
    probs = [0.2] * 5
    s = PenaltiesSampler(len(last), rep, freq, pres)
    for t in last:
        s.accept(t)
    run(probs, [s, DistSampler(0)], expected)


@pytest.mark.parametrize(
    "probs,last,expected,mult,base,allowed,last_n,breakers",
    [
        ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
        ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
    ],
)
def test_dry(probs, last, expected, mult, base, allowed, last_n, breakers):
    s = DRYSampler(mult, base, allowed, last_n, breaker_tokens=breakers)
    for t in last:
        s.accept(t)
    run(probs, [s, DistSampler(0)], expected)


@pytest.mark.parametrize("n,expected", [(1.0, [0.0, 0.0, 0.428571, 0.571429]), (0.0, P4), (3.0, P4)])
def test_top_n_sigma(n, expected):
    run(P4, [TopNSigmaSampler(n), DistSampler(0)], expected)


def _queue(n_vocab: int, seq: str, top_k: int, top_p: float, min_p: float) -> None:
    """test_sampler_queue: logits = log(id) over n_vocab tokens, samplers applied one by one."""
    with np.errstate(divide="ignore"):
        logits = np.log(np.arange(n_vocab, dtype=np.float32))
    cur = TokenDataArray(np.arange(n_vocab), logits)
    min_token_id, max_token_id = 0, n_vocab - 1
    f32 = np.float32
    for s in seq:
        sampler = {"k": TopKSampler(top_k), "p": TopPSampler(top_p, 1), "m": MinPSampler(min_p, 1)}[s]
        sampler.apply(cur)
        DistSampler(0).apply(cur)
        size = cur.size
        if s == "k":
            expected_size = min(size, top_k)
            min_token_id = max(min_token_id, n_vocab - top_k)
            assert size == expected_size
            assert cur.ids[0] == max_token_id
            assert cur.ids[expected_size - 1] == min_token_id
        elif s == "p":
            divisor = n_vocab * (n_vocab - 1) // 2 - min_token_id * (min_token_id - 1) // 2
            target = math.ceil(f32(top_p) * f32(divisor))
            min_token_id, expected_size, cumsum = n_vocab, 0, 0
            while True:
                min_token_id -= 1
                expected_size += 1
                cumsum += min_token_id
                if cumsum >= target:
                    break
            if min_token_id == 1:
                min_token_id -= 1
                expected_size += 1
            assert size == expected_size
            assert not cur.sorted or cur.ids[0] == max_token_id
            assert not cur.sorted or cur.ids[expected_size - 1] == min_token_id
        else:
            expected_size = max(math.ceil((f32(1.0) - f32(min_p)) * f32(n_vocab)), 1)
            expected_size = min(expected_size, size)
            min_token_id = max(int(math.floor(f32(min_p) * f32(n_vocab))), 1)
            min_token_id = max(min_token_id, n_vocab - size)
            min_token_id = min(min_token_id, n_vocab - 1)
            assert size == expected_size
            assert not cur.sorted or cur.ids[0] == max_token_id
            assert not cur.sorted or cur.ids[expected_size - 1] == min_token_id


@pytest.mark.parametrize(
    "seq,top_k,top_p,min_p",
    [
        ("k", 10000, 1.0, 1.0),
        ("k", 1, 1.0, 1.0),
        ("p", 10000, 1.0, 1.0),
        ("p", 10000, 0.0, 1.0),
        ("m", 10000, 1.0, 1.0),
        ("m", 10000, 1.0, 1e-12),
        ("k", 100, 1.0, 1.0),
        ("p", 10000, 0.0003, 1.0),
        ("p", 10000, 0.8, 1.0),
        ("m", 10000, 1.0, 9997.9 / 9999.0),
        ("m", 10000, 1.0, 0.1),
        ("kp", 100, 0.8, 0.1),
        ("km", 100, 0.8, 0.1),
        ("pk", 100, 0.8, 0.1),
        ("pm", 100, 0.8, 0.1),
        ("mk", 100, 0.8, 0.1),
        ("mp", 100, 0.8, 9997.9 / 9999.0),
        ("mp", 100, 0.8, 0.1),
        ("kpm", 100, 0.8, 0.1),
        ("kmp", 100, 0.8, 0.1),
        ("pkm", 100, 0.8, 0.1),
        ("pmk", 100, 0.8, 0.1),
        ("mkp", 100, 0.8, 0.1),
        ("mpk", 100, 0.8, 0.1),
    ],
)
def test_sampler_queue(seq, top_k, top_p, min_p):
    _queue(10000, seq, top_k, top_p, min_p)
