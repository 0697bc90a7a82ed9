"""``llamapy bench``: llama-bench's records and table on a tiny model."""

from __future__ import annotations

import json

import pytest

from llamapy.cli import main
from llamapy.cli.bench import bench, markdown
from tests.model.tiny import tiny_llama


def test_bench_records_and_table(tmp_path, capsys):
    path = tiny_llama(tmp_path / "t.gguf")
    recs = bench(str(path), [16], [4], reps=2, n_threads=1)
    assert [(r["n_prompt"], r["n_gen"]) for r in recs] == [(16, 0), (0, 4)]
    for r in recs:
        for k in ("model_filename", "model_type", "model_size", "n_threads", "n_prompt", "n_gen", "avg_ts",
                  "stddev_ts", "samples_ts", "samples_ns", "avg_ns"):  # fmt: skip
            assert k in r
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] > 0 and r["n_threads"] == 1
    table = markdown(recs)
    assert "| pp16 |" in table and "| tg4 |" in table
    assert main(["bench", "-m", str(path), "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["n_prompt"] == 8 and out[1]["n_gen"] == 2 and out[0]["model_size"] > 0
    assert out[0]["repack"] is True
    args = ["bench", "-m", str(path), *"-p 8 -n 0 -r 1 -t 1 --repack 0 -o json".split()]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)[0]["repack"] is False


def test_bench_depth(tmp_path, capsys):
    from llamapy.cli.bench import run_test
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    path = tiny_llama(tmp_path / "t.gguf")
    model = Model.load(str(path))
    ctx = Context(model, ContextParams(n_ctx=64, n_batch=16, n_ubatch=8, n_threads=1))
    # each repetition starts from the saved depth state: the cache holds depth + test tokens, from 0
    for p, g in ((8, 0), (0, 3)):
        secs = run_test(ctx, model, p, g, reps=2, n_depth=20)
        assert len(secs) == 2 and all(s > 0 for s in secs)
        assert ctx.memory.seq_pos_min(0) == 0 and ctx.memory.seq_pos_max(0) == 20 + p + g - 1
    recs = bench(str(path), [8], [2], reps=1, n_threads=1, n_depth=[0, 12])
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in recs] == [
        (8, 0, 0),
        (8, 0, 12),
        (0, 2, 0),
        (0, 2, 12),
    ]
    table = markdown(recs)
    assert "| pp8 |" in table and "| pp8 @ d12 |" in table and "| tg2 @ d12 |" in table
    assert main(["bench", "-m", str(path), "-p", "0", "-n", "2", "-d", "4,8", "-r", "1", "-t", "1"]) == 0
    out = capsys.readouterr().out
    assert "| tg2 @ d4 |" in out and "| tg2 @ d8 |" in out
    with pytest.raises(SystemExit):
        main(["bench", "-m", str(path), "-d", "x", "-r", "1"])
    assert "-d/--n-depth" in capsys.readouterr().err


def test_bench_profile_with_prompt_tests_only(tmp_path, capsys):
    """``--profile`` with ``-n 0`` (prompt tests only) profiles 32 generated tokens (it divided by zero)."""
    path = tiny_llama(tmp_path / "t.gguf")
    assert main(["bench", "-m", str(path), "-p", "8", "-n", "0", "-r", "1", "-t", "1", "--profile"]) == 0
    cap = capsys.readouterr()
    assert "| pp8 |" in cap.out and "tg32:" in cap.err


def test_bench_profile_follows_repack(tmp_path):
    """``--profile`` profiles the kernels the bench ran: ``--repack 0`` reads the file's rows (no 8-row
    kernel in its table), the default repacks (8-row kernels)."""
    from llamapy.cli.bench import profile_tg

    path = tiny_llama(tmp_path / "t.gguf", ggml_type="Q4_0")
    assert "_x8" in profile_tg(str(path), 2, 1, top=40)
    assert "_x8" not in profile_tg(str(path), 2, 1, top=40, repack=False)


def test_bench_profile_runs_after_the_prefetch_tuning(tmp_path, monkeypatch):
    """The profiled tokens come after the 8-row kernels' prefetch tuners have decided (their first decode
    tokens alternate distances, so a profile of them showed rates the decode does not run at); a fixed
    distance needs no tuning tokens."""
    from llamapy.cli.bench import PROFILE_TUNE_TOKENS, profile_tg

    path = tiny_llama(tmp_path / "t.gguf", ggml_type="Q4_0")
    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    head = profile_tg(str(path), 2, 1, top=5).splitlines()[0]
    n = int(head.split("after ")[1].split(" tokens of prefetch tuning")[0])
    assert 0 < n <= PROFILE_TUNE_TOKENS
    monkeypatch.setenv("LLAMAPY_X8_PREFETCH", "2048")
    assert "tuning" not in profile_tg(str(path), 2, 1, top=5).splitlines()[0]


def test_until_tuned_stops_at_its_limit(tmp_path, monkeypatch):
    from llamapy.cli.bench import _until_tuned, run_test
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model

    monkeypatch.delenv("LLAMAPY_X8_PREFETCH", raising=False)
    model = Model.load(str(tiny_llama(tmp_path / "t.gguf", ggml_type="Q4_0")))
    ctx = Context(model, ContextParams(n_ctx=256, n_threads=1))
    tuners = ctx.sched.backends[0].prefetch
    assert _until_tuned(ctx, model) == 0 and not tuners.by_type  # no decode graph yet: nothing to tune
    run_test(ctx, model, 0, 1, 1)  # builds the decode graph: its steps' tuners
    assert tuners.tuning and "Q4_0" in tuners.by_type
    assert _until_tuned(ctx, model, limit=3) == 3 and tuners.tuning
    n = _until_tuned(ctx, model)
    assert n > 0 and not tuners.tuning and _until_tuned(ctx, model) == 0


def test_bench_profile_uses_the_runs_context_options(tmp_path, monkeypatch, capsys):
    """``--profile`` builds its context with the run's ``-ub``/``-ctk``/``-ctv``/``-nkvo`` (it used the
    defaults: a q8_0 cache run was profiled on an f16 cache)."""
    import llamapy.context as context_mod

    seen = []
    real = context_mod.Context

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, model, params=None, *a, **k):  # type: ignore[no-untyped-def]
            seen.append(params)
            super().__init__(model, params, *a, **k)

    monkeypatch.setattr(context_mod, "Context", Recording)
    path = tiny_llama(tmp_path / "t.gguf")
    argv = ["bench", "-m", str(path), "-p", "0", "-n", "2", "-r", "1", "-t", "1", "-ub", "64"]
    assert main([*argv, "-ctk", "q8_0", "-ctv", "q8_0", "-nkvo", "1", "--profile"]) == 0
    assert "tg2:" in capsys.readouterr().err
    assert len(seen) == 2  # the bench's test, then the profile's context
    for p in seen:
        assert (p.type_k, p.type_v, p.n_ubatch, p.offload_kqv) == ("q8_0", "q8_0", 64, False)
