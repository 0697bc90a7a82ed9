"""benchmarks/gpu_check.sh in its smoke mode (Numba's CUDA simulator, toy shapes), so that the script a
GPU session runs in one go cannot rot: every phase must come out ``ok`` and every result must be there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("setup", "models", "pytest", "agree", "graph", "speed")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    pytest.importorskip("numba_cuda")
    tmp = tmp_path_factory.mktemp("gpu_check")
    whl = tmp / "whl"
    whl.mkdir()
    (whl / "example-1.0-py3-none-any.whl").write_bytes(b"")  # the install step lists it (pip not run)
    out = tmp / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMAPY_CUDA_REAL", "GPU_CHECK_PHASES")}
    env.update(GPU_CHECK_SMOKE="1", OUT=str(out), GPU_CHECK_WHL=str(whl), GPU_CHECK_WORK=str(tmp / "work"))
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return r, out


@pytest.mark.slow
def test_every_phase_runs_and_reports(smoke):
    r, out = smoke
    assert r.returncode == 0, r.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "SMOKE RUN" in summary and "simulator" in summary
    for p in PHASES:
        assert f"| {p} | ok |" in summary, (p, summary)
    names = sorted(f.name for f in out.iterdir())
    assert len(names) <= 8, names  # the GPU machine sends back at most 8 files
    assert {"summary.md", "setup.log", "pytest.log", "speed.jsonl"} <= set(names), names
    setup = (out / "setup.log").read_text()
    assert "wheels in" in setup and "example-1.0-py3-none-any.whl" in setup
    assert "llamapy CUDA backend: usable" in setup
    assert "CPU warm-up on" in setup
    assert "passed" in (out / "pytest.log").read_text()


@pytest.mark.slow
def test_agreement_graph_and_speed_sections(smoke):
    _, out = smoke
    summary = (out / "summary.md").read_text()
    agree = summary.split("## agree")[1].split("## ")[0]
    rows = [ln for ln in agree.splitlines() if ln.startswith("| tiny-")]
    assert len(rows) == 4 and all(ln.rstrip().endswith("| ok |") for ln in rows), agree  # 2 files x 2 ngl
    assert "tiny-qwen.Q4_K_M.gguf | all+out |" in agree and "tiny-smollm2.Q8_0.gguf | 1 |" in agree
    graph = summary.split("## graph")[1].split("## ")[0]
    for run in ("walk again", "replay", "CUDA graph"):
        assert f"| {run} | yes |" in graph, graph
    recs = [json.loads(ln) for ln in (out / "speed.jsonl").read_text().splitlines()]
    assert "copy_rate" in recs[0]  # "error": no CuPy under the simulator
    tests = {(r["file"], r["test"]) for r in recs[1:] if r.get("avg_ts", 0) > 0}
    assert {("tiny-smollm2.Q4_K_M.gguf", t) for t in ("pp4", "tg2", "tg2@8")} <= tests, tests
    tg = next(r for r in recs[1:] if r.get("test") == "tg2@8")
    assert tg["read_gbs"] > 0 and tg["backends"] == "CUDA" and tg["n_gpu_layers"] == 99
