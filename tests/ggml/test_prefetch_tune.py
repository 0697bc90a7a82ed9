"""The 8-row kernels' prefetch distance (``prefetch_tune``): every kernel gives the same bits at any
distance, into L2 or (negative) L1; the tuner measures the distances in turn on the decode steps
(counting complete rounds only) and keeps the fastest by a margin, else the default;
``LLAMAPY_X8_PREFETCH`` fixes it; a backend's decode steps go through their type's tuner, each type
decides on its own, and their results do not change when it decides."""

from __future__ import annotations

import re

import numpy as np
import pytest

from llamapy.errors import LlamapyError
from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import prefetch_tune as pt
from llamapy.ggml.cpu import q4k_x8, q5k_x8, q6k_x8, q40_x8, q50_x8, q80_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.quants import quantize

#: 0: the default (two groups ahead); one line; the distance measured on Intel; past every weight's end;
#: the same into L1
DISTANCES = (0, 64, 2048, 1 << 40, -64, -2048, -(1 << 40))


def _q(t: T, rows: int, K: int, seed: int) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((rows, K)).astype(np.float32)
    return np.asarray(quantize(w, t)).reshape(rows, -1)


def _dense() -> list[tuple[str, T, object, object]]:
    from llamapy.ggml.cpu import q4k_x8_kernels as k4
    from llamapy.ggml.cpu import q5k_x8_kernels as k5
    from llamapy.ggml.cpu import q6k_x8_kernels as k6
    from llamapy.ggml.cpu import q40_x8_kernels as k40
    from llamapy.ggml.cpu import q40_x8_rows as r40
    from llamapy.ggml.cpu import q50_x8_kernels as k50
    from llamapy.ggml.cpu import q80_x8_kernels as k80

    return [
        ("q4_k", T.Q4_K, q4k_x8.repack, (k4.mm_q4_k_x8, k4.mm_q4_k_x8r4)),
        ("q5_k", T.Q5_K, q5k_x8.repack, (k5.mm_q5_k_x8, k5.mm_q5_k_x8r4)),
        ("q6_k", T.Q6_K, q6k_x8.repack, (k6.mm_q6_k_x8, k6.mm_q6_k_x8r4)),
        ("q4_0", T.Q4_0, q40_x8.repack, (k40.mm_q4_0_x8, r40.mm_q4_0_x8r4, r40.mm_q4_0_x8r8)),
        ("q4_1", T.Q4_1, q40_x8.repack, (k40.mm_q4_1_x8, r40.mm_q4_1_x8r4, r40.mm_q4_1_x8r8)),
        ("q5_0", T.Q5_0, q50_x8.repack, (k50.mm_q5_0_x8, k50.mm_q5_0_x8r4)),
        ("q5_1", T.Q5_1, q50_x8.repack, (k50.mm_q5_1_x8,)),
        ("q8_0", T.Q8_0, q80_x8.repack, (k80.mm_q8_0_x8, k80.mm_q8_0_x8r4)),
    ]


@pytest.mark.parametrize("case", range(8), ids=lambda i: _dense()[i][0])
def test_every_dense_kernel_gives_the_same_bits_at_every_distance(case):
    _, t, repack, kernels = _dense()[case]
    R = repack(_q(t, 40, 768, case), t)  # 5 groups of eight rows
    for M in (1, 9):
        x = np.random.default_rng(M).standard_normal((M, 768)).astype(np.float32)
        for kern in kernels:
            ref = np.zeros((M, 40), np.float32)
            kern(R, x, ref, 0)
            assert np.isfinite(ref).all()
            for d in DISTANCES[1:]:
                out = np.zeros((M, 40), np.float32)
                kern(R, x, out, d)
                np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_moe_kernels_give_the_same_bits_at_every_distance(t):
    from llamapy.ggml.cpu.moe_x8 import _layout

    E, N, K, U, Tn = 3, 16, 512, 2, 3
    raw = _q(t, E * N, K, 7).reshape(E, N, -1)
    R = np.stack([(q4k_x8.repack if t == T.Q4_K else q6k_x8.repack)(raw[e]) for e in range(E)])
    kern = _layout(t)[4]
    x = np.random.default_rng(3).standard_normal((Tn, U, K)).astype(np.float32)
    ids = np.array([[0, 2], [1, 2], [2, 0]], np.int32)
    ref = np.zeros((Tn * U, N), np.float32)
    assert kern(R, x, ids, ref, 256, 2, 0) == -1
    for d in DISTANCES[1:]:
        out = np.zeros((Tn * U, N), np.float32)
        assert kern(R, x, ids, out, 256, 2, d) == -1
        np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_remeasure_from_the_environment(monkeypatch):
    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    assert not pt.remeasure_from_env() and not pt.PrefetchTuners.from_env().remeasure
    for v in ("auto", " AUTO "):
        monkeypatch.setenv("LLAMAPY_X8_PREFETCH", v)
        assert pt.remeasure_from_env() and pt.PrefetchTuners.from_env().remeasure
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", "2048")
    assert not pt.remeasure_from_env()


def test_distance_from_the_environment(monkeypatch):
    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    assert pt.distance_from_env() is None
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", "auto")
    assert pt.distance_from_env() is None
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", " 4096 ")
    assert pt.distance_from_env() == 4096
    tu = pt.PrefetchTuner.from_env()
    assert (tu.distance, tu.tuning) == (4096, False)
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", "-2048")  # into L1
    assert pt.distance_from_env() == -2048
    tu = pt.PrefetchTuners.from_env().for_type("Q5_0")
    assert (tu.distance, tu.tuning) == (-2048, False)
    for bad in ("2k", "-", "--2048", "+2048"):
        monkeypatch.setenv("LLAMAPY_X8_PREFETCH", bad)
        with pytest.raises(pt.PrefetchEnvError, match=re.escape(f"LLAMAPY_X8_PREFETCH={bad!r}")) as e:
            pt.distance_from_env()
        assert isinstance(e.value, LlamapyError)  # the CLI's one-line error, not a traceback


class FakeClock:
    """A clock that the fake kernels advance by their cost at each distance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run_tokens(
    tu: pt.PrefetchTuner, clock: FakeClock, cost: dict[int, float], steps: int, tokens: int
) -> list:
    """``tokens`` decode tokens of ``steps`` steps (step ``s`` costs ``(s + 1) * cost[d]``); the
    distances each step ran at, per token."""
    states = [tu.counter() for _ in range(steps)]
    seen = []

    for _ in range(tokens):
        row = []
        for s in range(steps):

            def call(d: int, s: int = s, row: list = row) -> int:
                clock.now += (s + 1) * cost[d]
                row.append(d)
                return d

            assert tu.run(call, states[s]) == row[-1]
        seen.append(row)
    return seen


def test_the_tuner_takes_the_faster_distance_after_its_rounds():
    clock = FakeClock()
    tu = pt.PrefetchTuner(candidates=(0, 2048), warmup=2, rounds=3, margin=0.04, clock=clock)
    seen = _run_tokens(tu, clock, {0: 1.0, 2048: 0.8}, steps=4, tokens=12)
    assert seen[0] == seen[1] == [0] * 4  # warm-up: the default, not timed
    assert [r[0] for r in seen[2:8]] == [0, 2048] * 3  # each token one distance, in turn
    assert all(len(set(r)) == 1 for r in seen)
    assert tu.by_round == [pytest.approx([10 * 1.0, 10 * 0.8])] * 3  # steps cost 1 + 2 + 3 + 4 units
    assert not tu.tuning and tu.distance == 2048
    assert all(r == [2048] * 4 for r in seen[8:])


@pytest.mark.parametrize(("alt", "expect"), [(0.97, 0), (1.2, 0), (0.9, 2048)])
def test_the_default_stays_unless_another_is_faster_by_the_margin(alt, expect):
    clock = FakeClock()
    tu = pt.PrefetchTuner(candidates=(0, 2048), warmup=0, rounds=2, margin=0.04, clock=clock)
    _run_tokens(tu, clock, {0: 1.0, 2048: alt}, steps=2, tokens=6)
    assert not tu.tuning and tu.distance == expect


def test_the_median_round_decides_not_a_burst():
    """One round slowed 50-fold (a VM's noisy neighbour) does not outweigh the others."""
    clock = FakeClock()
    tu = pt.PrefetchTuner(candidates=(0, 2048), warmup=0, rounds=5, clock=clock)
    states = [tu.counter()]
    for r in range(5):
        cost = {0: 50.0 if r == 2 else 1.0, 2048: 1.2}
        for d in (0, 2048):

            def call(dd: int, cost: dict = cost) -> int:
                clock.now += cost[dd]
                return dd

            assert tu.run(call, states[0]) == d
    assert tu.totals[0] > tu.totals[1]  # the sum would take 2048
    tu.run(lambda d: d, states[0])
    assert not tu.tuning and tu.distance == 0


def test_fast_tokens_are_measured_for_more_rounds():
    """Rounds are added until each distance has run ``min_seconds`` (at most ``max_rounds``)."""
    clock = FakeClock()
    tu = pt.PrefetchTuner(
        candidates=(0, 2048), warmup=0, rounds=2, clock=clock, min_seconds=0.01, max_rounds=8
    )
    seen = _run_tokens(tu, clock, {0: 0.001, 2048: 0.0005}, steps=2, tokens=16)  # 3 ms a token at 0
    # 7 rounds: 1.5 ms a token at 2048, 10.5 ms after 7
    assert [r[0] for r in seen[:14]] == [0, 2048] * 7 and seen[14] == [2048, 2048]
    assert len(tu.by_round) == 7 and not tu.tuning and tu.distance == 2048
    tu = pt.PrefetchTuner(
        candidates=(0, 2048), warmup=0, rounds=2, clock=clock, min_seconds=10.0, max_rounds=3
    )
    _run_tokens(tu, clock, {0: 0.001, 2048: 0.0005}, steps=2, tokens=8)
    assert len(tu.by_round) == 3 and not tu.tuning


def test_a_default_fastest_in_every_round_decides_after_the_minimum_rounds():
    """Fast tokens measure more rounds, unless the default won each round: then ``rounds`` suffice (on
    the AMD VM the MoE shape's small experts measured 40 rounds at a distance 4 % slower)."""
    clock = FakeClock()
    tu = pt.PrefetchTuner(
        candidates=(0, 2048), warmup=0, rounds=3, clock=clock, min_seconds=10.0, max_rounds=40
    )
    _run_tokens(tu, clock, {0: 0.001, 2048: 0.00104}, steps=2, tokens=7)
    assert len(tu.by_round) == 3 and not tu.tuning and tu.distance == 0
    # one round the other way (noise): measuring goes on
    tu = pt.PrefetchTuner(
        candidates=(0, 2048), warmup=0, rounds=3, clock=clock, min_seconds=10.0, max_rounds=40
    )
    states = [tu.counter()]
    for r in range(4):
        for _ in (0, 2048):
            cost = {0: 1.0, 2048: 0.9 if r == 1 else 1.1}
            tu.run(lambda dd, cost=cost: setattr(clock, "now", clock.now + cost[dd] * 1e-4), states[0])
    assert tu.tuning and len(tu.by_round) == 4


def test_an_incomplete_round_counts_nothing():
    """A step that stops being called after the first distance of a round (its graph was replaced)
    adds nothing."""
    clock = FakeClock()
    tu = pt.PrefetchTuner(candidates=(0, 2048), warmup=0, rounds=4, clock=clock)
    _run_tokens(tu, clock, {0: 100.0, 2048: 1.0}, steps=1, tokens=3)  # a round and a half
    assert tu.by_round == [[100.0, 1.0]]


def test_a_fixed_distance_is_never_measured():
    clock = FakeClock()
    tu = pt.PrefetchTuner(fixed=4096, clock=clock)
    seen = _run_tokens(tu, clock, {4096: 1.0}, steps=2, tokens=10)
    assert all(r == [4096, 4096] for r in seen) and tu.by_round == []


def _decode_step(be: CPUBackend, t: T, M: int):
    raw = _q(t, 48, 1536, 11)
    a = ops.weight("blk.0.ffn_up.weight", t, (48, 1536), raw)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.zeros((M, 48), np.float32)
    mod = {T.Q4_K: q4k_x8, T.Q8_0: q80_x8}[t]
    step = mod.mul_mat_step(be, a, raw, x, out, None, any_memory=True)
    assert step is not None
    return step, out


@pytest.mark.parametrize("t", [T.Q4_K, T.Q8_0], ids=lambda t: t.name)
def test_a_backend_decode_step_is_measured_and_its_result_never_changes(t, monkeypatch):
    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    be = CPUBackend(n_threads=2)
    clock = FakeClock()
    seen: list[pt.Choice] = []
    be.prefetch = pt.PrefetchTuners(candidates=(0, 2048, pt.ONE_STREAM), warmup=1, rounds=2, clock=clock)
    step, out = _decode_step(be, t, 1)
    prompt, _ = _decode_step(be, t, 6)  # several rows: never measured
    tu = be.prefetch.for_type(t.name)
    real_run = tu.run

    def run(call, state):  # the kernel at 2048 "costs" less, one stream a thread less again
        def timed(c: pt.Choice):
            clock.now += {0: 1.0, 2048: 0.7, pt.ONE_STREAM: 0.5}[c]
            seen.append(c)
            return call(c)

        return real_run(timed, state)

    tu.run = run  # type: ignore[method-assign]
    outs = []
    for _ in range(9):
        step()
        prompt()
        outs.append(out.copy())
    one = pt.ONE_STREAM
    assert seen == [0, 0, 2048, one, 0, 2048, one, one]  # warm-up, two rounds; the eighth call decides
    assert tu.choice == one and (tu.distance, tu.streams) == (0, 1) and not tu.tuning
    assert list(be.prefetch.by_type) == [t.name]
    for o in outs[1:]:
        np.testing.assert_array_equal(o.view(np.uint32), outs[0].view(np.uint32))


def test_the_environment_fixes_a_backend_distance(monkeypatch):
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", "-2048")
    be = CPUBackend(n_threads=1)
    step, out = _decode_step(be, T.Q4_K, 1)
    step()
    assert np.isfinite(out).all()
    tu = be.prefetch.for_type("Q4_K")
    assert tu.distance == -2048 and not tu.tuning


def test_each_weight_type_decides_its_own_distance(monkeypatch):
    """Two types' decode steps in one backend: each type's tuner measures its own steps and keeps the
    distance that is faster for it (Q4_K: 2048 into L2; Q8_0: 2048 into L1), the results unchanged."""
    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    be = CPUBackend(n_threads=2)
    clock = FakeClock()
    be.prefetch = pt.PrefetchTuners(candidates=(0, 2048, -2048), warmup=1, rounds=2, clock=clock)
    fast = {"Q4_K": 2048, "Q8_0": -2048}
    seen: dict[str, list[int]] = {"Q4_K": [], "Q8_0": []}
    steps = []
    for t in (T.Q4_K, T.Q8_0):
        step, out = _decode_step(be, t, 1)
        tu = be.prefetch.for_type(t.name)
        real_run = tu.run

        def run(call, state, real_run=real_run, name=t.name):  # its fast distance "costs" less
            def timed(d: int):
                clock.now += 0.5 if d == fast[name] else 1.0
                seen[name].append(d)
                return call(d)

            return real_run(timed, state)

        tu.run = run  # type: ignore[method-assign]
        steps.append((step, out))
    outs = []
    for _ in range(9):
        for step, _ in steps:
            step()
        outs.append([o.copy() for _, o in steps])
    assert sorted(be.prefetch.by_type) == ["Q4_K", "Q8_0"]
    for name, d in fast.items():
        tu = be.prefetch.for_type(name)
        assert tu.distance == d and not tu.tuning
        assert seen[name] == [0, 0, 2048, -2048, 0, 2048, -2048, d]  # warm-up, two rounds, decided
    for o in outs[1:]:
        for a, b in zip(o, outs[0], strict=True):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_32_element_types_also_measure_into_l1():
    tus = pt.PrefetchTuners()
    for key in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        assert tus.for_type(key).candidates == pt.L1_CANDIDATES == (0, 2048, -2048, (0, 1))
    for key in ("Q4_K", "Q5_K", "Q6_K", "moe Q4_K", "moe Q6_K"):
        assert tus.for_type(key).candidates == pt.CANDIDATES == (0, 2048, (0, 1))
    assert tus.for_type("Q5_0") is tus.for_type("Q5_0") and tus.for_type("Q5_0").name == "Q5_0"
    assert tus.tuning  # until every type's tuner has decided
    for tu in tus.by_type.values():
        tu.tuning = False
    assert not tus.tuning and not pt.PrefetchTuners().tuning and not pt.PrefetchTuners(fixed=0).tuning
    assert pt.PrefetchTuners(candidates=(0, 4096)).for_type("Q5_0").candidates == (0, 4096)
