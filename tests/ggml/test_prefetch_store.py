"""Prefetch decisions kept across processes (``prefetch_tune.PrefetchStore``, ``PrefetchTuners.bind``): a
decided type starts decided in a later set of tuners bound to the same file and scope, and only there;
``remeasure`` and a fixed distance ignore it; stale, foreign or unreadable entries read as none; the file
stays bounded; an unwritable place keeps nothing and raises nothing. Through a context: a second context on
the same model file decodes without tuning, one on another file (or a rewritten one) tunes."""

from __future__ import annotations

import json
import os
import time

import pytest

from llamapy.ggml.cpu import prefetch_tune as pt


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _decide(tus: pt.PrefetchTuners, key: str, clock: Clock, fast: int) -> pt.PrefetchTuner:
    """Run ``key``'s tuner on one fake step until it decides, ``fast`` the cheaper distance."""
    tu = tus.for_type(key)
    state = tu.counter()
    for _ in range(100):
        if not tu.tuning:
            break

        def call(d: int) -> int:
            clock.now += 0.5 if d == fast else 1.0
            return d

        tu.run(call, state)
    assert not tu.tuning
    return tu


def _tuners(clock: Clock, **kw: object) -> pt.PrefetchTuners:
    return pt.PrefetchTuners(warmup=0, rounds=2, clock=clock, min_seconds=0.0, **kw)


def test_a_decision_is_kept_for_its_scope_only(tmp_path):
    path = tmp_path / "tune" / "prefetch.json"
    clock = Clock()
    tus = _tuners(clock)
    tus.bind(path, "model-a", 2)
    assert _decide(tus, "Q4_K", clock, 2048).distance == 2048
    assert _decide(tus, "Q8_0", clock, -2048).distance == -2048
    assert path.exists() and len(json.loads(path.read_text())) == 2
    again = _tuners(clock)
    again.bind(path, "model-a", 2)
    for key, d in (("Q4_K", 2048), ("Q8_0", -2048)):
        tu = again.for_type(key)
        assert tu.distance == d and not tu.tuning and tu.by_round == []
    assert again.for_type("Q6_K").tuning  # a type not decided before
    for scope, threads in (("model-b", 2), ("model-a", 1)):
        other = _tuners(clock)
        other.bind(path, scope, threads)
        assert other.for_type("Q4_K").tuning and other.for_type("Q4_K").distance == 0
    fresh = _tuners(clock, remeasure=True)  # LLAMAPY_X8_PREFETCH=auto
    fresh.bind(path, "model-a", 2)
    assert fresh.for_type("Q4_K").tuning
    assert _decide(fresh, "Q4_K", clock, 0).distance == 0  # and keeps what it measured now
    later = _tuners(clock)
    later.bind(path, "model-a", 2)
    assert later.for_type("Q4_K").distance == 0 and not later.for_type("Q4_K").tuning
    fixed = _tuners(clock, fixed=4096)
    fixed.bind(path, "model-a", 2)
    assert fixed.store is None and fixed.for_type("Q4_K").distance == 4096


def test_a_choice_of_one_stream_is_kept(tmp_path):
    st = pt.PrefetchStore(tmp_path / "p.json", "s")
    st.put("Q6_K", pt.CANDIDATES, pt.ONE_STREAM)
    assert st.get("Q6_K", pt.CANDIDATES) == pt.ONE_STREAM == (0, 1)
    assert st.get("Q6_K", (0, 2048)) is None  # measured among other candidates


def test_unbound_tuners_keep_nothing(tmp_path):
    clock = Clock()
    tus = _tuners(clock)
    _decide(tus, "Q4_K", clock, 2048)
    assert tus.store is None and not list(tmp_path.iterdir())


def test_the_machine_key_holds_the_target_and_threads(monkeypatch):
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    a = pt.machine_key(2)
    assert "haswell" in a and a.endswith("|t2") and pt.machine_key(1) != a
    monkeypatch.delenv("NUMBA_CPU_NAME")
    assert pt.machine_key(2) != a


@pytest.mark.parametrize(
    "content",
    ["", "not json", "[1, 2]", '{"k": 3}'],
    ids=["empty", "garbage", "a list", "a bad entry"],
)
def test_an_unreadable_file_reads_as_empty_and_is_replaced(tmp_path, content):
    path = tmp_path / "prefetch.json"
    path.write_text(content)
    st = pt.PrefetchStore(path, "s")
    assert st.get("Q4_K", (0, 2048)) is None
    st.put("Q4_K", (0, 2048), 2048)
    assert st.get("Q4_K", (0, 2048)) == 2048


def test_stale_or_foreign_entries_read_as_none(tmp_path):
    st = pt.PrefetchStore(tmp_path / "p.json", "s")
    st.put("Q4_K", (0, 2048), 2048)
    assert st.get("Q4_K", (0, 2048, -2048)) is None  # measured among other candidates
    assert pt.PrefetchStore(tmp_path / "p.json", "t").get("Q4_K", (0, 2048)) is None
    data = json.loads((tmp_path / "p.json").read_text())
    (key,) = data
    for bad in ([4096, time.time()], [2048, time.time() - 2 * pt.PrefetchStore.MAX_AGE_S],
                [2048, time.time() + 3600], ["x", 1.0], [2048]):  # fmt: skip
        (tmp_path / "p.json").write_text(json.dumps({key: bad}))
        assert st.get("Q4_K", (0, 2048)) is None, bad


def test_the_file_keeps_the_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(pt.PrefetchStore, "MAX_ENTRIES", 5)
    st = pt.PrefetchStore(tmp_path / "p.json", "s")
    for i in range(8):
        st.put(f"T{i}", (0, 2048), 2048)
        time.sleep(0.002)
    data = json.loads((tmp_path / "p.json").read_text())
    assert len(data) == 5
    assert [st.get(f"T{i}", (0, 2048)) for i in range(8)] == [None] * 3 + [2048] * 5
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left


def test_a_place_that_is_a_file_keeps_nothing(tmp_path):
    (tmp_path / "tune").write_text("a file where the folder goes")
    st = pt.PrefetchStore(tmp_path / "tune" / "prefetch.json", "s")
    st.put("Q4_K", (0, 2048), 2048)  # no exception
    assert st.get("Q4_K", (0, 2048)) is None


def test_a_second_context_on_the_same_file_starts_decided(tmp_path, monkeypatch):
    from llamapy.cli.bench import _until_tuned, run_test
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    monkeypatch.delenv("LLAMAPY_TUNE_DIR", raising=False)  # the default place: the llamapy cache
    monkeypatch.setenv("LLAMAPY_CACHE", str(tmp_path / "cache"))

    def context(path: object) -> tuple[Context, Model]:
        model = Model.load(str(path))
        return Context(model, ContextParams(n_ctx=256, n_threads=1)), model

    path = tiny_llama(tmp_path / "t.gguf", ggml_type="Q4_0")
    ctx, model = context(path)
    run_test(ctx, model, 0, 1, 1)
    assert _until_tuned(ctx, model) > 0
    decided = {k: tu.distance for k, tu in ctx.sched.backends[0].prefetch.by_type.items()}
    assert (tmp_path / "cache" / "tune" / "prefetch.json").exists()
    ctx2, model2 = context(path)
    run_test(ctx2, model2, 0, 1, 1)
    tus = ctx2.sched.backends[0].prefetch
    assert not tus.tuning and {k: tu.distance for k, tu in tus.by_type.items()} == decided
    other = tiny_llama(tmp_path / "u.gguf", ggml_type="Q4_0")
    ctx3, model3 = context(other)
    run_test(ctx3, model3, 0, 1, 1)
    assert ctx3.sched.backends[0].prefetch.tuning
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # the same file rewritten
    ctx4, model4 = context(path)
    run_test(ctx4, model4, 0, 1, 1)
    assert ctx4.sched.backends[0].prefetch.tuning


def test_the_tune_dir_holds_the_decisions(tmp_path, monkeypatch):
    """``LLAMAPY_TUNE_DIR`` moves the kept decisions out of the llamapy cache (the tests keep theirs in a
    directory of the run, ``tests/conftest.py``)."""
    from llamapy.cli.bench import _until_tuned, run_test
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    monkeypatch.setenv("LLAMAPY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LLAMAPY_TUNE_DIR", str(tmp_path / "tune"))
    path = tiny_llama(tmp_path / "t.gguf", ggml_type="Q4_0")
    model = Model.load(str(path))
    ctx = Context(model, ContextParams(n_ctx=256, n_threads=1))
    run_test(ctx, model, 0, 1, 1)
    assert _until_tuned(ctx, model) > 0
    assert (tmp_path / "tune" / "prefetch.json").exists()
    assert not (tmp_path / "cache" / "tune").exists()
