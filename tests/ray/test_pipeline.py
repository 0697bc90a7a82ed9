"""Pipeline parallel on a local Ray cluster (num_cpus=2): SmolLM2, a tiny MoE and a tiny hybrid
(Mamba-2 + attention) split over 2 and 3 stage actors give the single process's logits and greedy text;
each stage reads only its share of the weights; a stage that cannot read its file, a stage lost during
a decode, and a placement that cannot be met fail with PipelineError (never a hang)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamapy.batch import Batch, BatchError
from llamapy.context import Context, ContextParams
from llamapy.model import Model
from llamapy.ray.pipeline import PipelineContext, PipelineError
from tests.ray.pipeline_models import N_VOCAB, tiny_hybrid, tiny_moe

pytestmark = pytest.mark.slow

CP = dict(n_ctx=256, n_threads=1, n_ubatch=4)  # 4-token ubatches: a prompt crosses stages in pieces
PROMPT = [5, 17, 33, 2, 9, 101, 7, 64, 200, 3]  # 10 tokens: ubatches of 4, 4, 2


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    logging.getLogger("ray").setLevel(logging.WARNING)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 << 20,
             log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pipeline")
    return {"moe": tiny_moe(d / "moe.gguf"), "hybrid": tiny_hybrid(d / "hybrid.gguf")}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _run(ctx: Any, n_gen: int = 5) -> tuple[list[np.ndarray], list[int]]:
    """The prompt (every row's logits), then ``n_gen`` greedy tokens one by one (sequence 0 from empty)."""
    ctx.memory.seq_rm(0, -1, -1)
    ctx.decode(Batch.from_tokens(PROMPT, pos0=0, logits_all=True))
    logits, toks = [np.array(ctx.get_logits())], []
    for i in range(n_gen):
        toks.append(int(np.argmax(ctx.get_logits()[-1])))
        ctx.decode(Batch.from_tokens([toks[-1]], pos0=len(PROMPT) + i))
        logits.append(np.array(ctx.get_logits()))
    return logits, toks


def _stage_cpus(n: int) -> float:
    return 1.0 if n <= 2 else 0.5  # 3 stages on the 2-CPU cluster


class _LocalChain:
    """The stages of a pipeline in this process, chained by hand: the same cut as the actors run."""

    def __init__(self, path: Path, n_stages: int) -> None:
        from llamapy.ray.pipeline_stage import PipelineStage, layer_ranges

        n_layer = Model.load(path).hparams.n_layer
        self.stages = [PipelineStage(i, str(path), a, b, dict(CP)) for i, (a, b) in enumerate(layer_ranges(n_layer, n_stages))]  # fmt: skip
        for st in self.stages:
            st.ready()
        self.memory = self

    def seq_rm(self, *args: Any) -> None:
        for st in self.stages:
            st.memory_call("seq_rm", args, {})

    def decode(self, batch: Batch) -> None:
        h = None
        for st in self.stages:
            h = st.decode(batch, h)
        self.logits = h[0]

    def get_logits(self) -> np.ndarray:
        return self.logits


def _check_equal(ref: tuple[list[np.ndarray], list[int]], got: tuple[list[np.ndarray], list[int]]) -> float:
    assert got[1] == ref[1]  # greedy tokens
    for a, b in zip(got[0], ref[0], strict=True):
        assert a.shape == b.shape and np.isfinite(b).all()
        assert _rel(a, b) <= 1e-6
    return max(map(_rel, got[0], ref[0]))


@pytest.mark.parametrize(
    "kind,n_stages", [("moe", 2), ("moe", 3), ("hybrid", 2), ("hybrid", 3), ("smollm2", 2)]
)
def test_cut_in_process(tiny_files: dict[str, Path], smollm2_path: Path, kind: str, n_stages: int) -> None:
    """Every split of the tiny MoE and hybrid (KV cache, recurrent states, expert routing per stage) and
    SmolLM2's 2-stage split give the single context's logits, the stages chained in this process (the
    actors run the same cut: SmolLM2 over 2 and 3 actors and the hybrid over 3 below)."""
    path = smollm2_path if kind == "smollm2" else tiny_files[kind]
    ref = _run(Context(Model.load(path), ContextParams(**CP)))
    _check_equal(ref, _run(_LocalChain(path, n_stages)))


def test_tiny_hybrid_three_stage_actors(ray_local: None, tiny_files: dict[str, Path]) -> None:
    """The hybrid MoE (Mamba-2 + attention layers, experts) over 3 stage actors of 0.5 CPU."""
    model = Model.load(tiny_files["hybrid"])
    ref = _run(Context(model, ContextParams(**CP)))
    t0 = time.monotonic()
    pc = PipelineContext(model, 3, dict(CP), stage_cpus=0.5)
    try:
        up = time.monotonic() - t0
        err = _check_equal(ref, _run(pc))
        stats = pc.stage_stats()
        assert [s["layers"] for s in stats] == [[0, 2], [2, 3], [3, 4]]
        assert not pc.micro_batches  # a recurrent state: batches go whole (its own split)
        assert len({s["pid"] for s in stats}) == 3
        # the first stage's own errors leave every stage as it was: raised as themselves, the pipeline up
        with pytest.raises(BatchError, match="not a valid token id"):
            pc.decode(Batch.from_tokens([N_VOCAB + 5], pos0=len(PROMPT) + 5))
        assert pc.health()["ok"]
        pc.decode(Batch.from_tokens([1], pos0=len(PROMPT) + 5))
        assert pc.get_logits().shape == (1, N_VOCAB)
        print(f"\nhybrid x3 actors: up in {up:.1f} s, max rel {err:.1e}")
    finally:
        pc.close()


def _file_tensor_bytes(model: Model) -> int:
    return sum(int(t.nbytes) for t in model.impl.w.values())


def _weight_shares(pc: PipelineContext, model: Model, path: Path) -> list[dict[str, Any]]:
    """Each stage read its own layers' weights only: the file's pages it holds, and the tensor bytes its
    graphs use (the tied token embedding is read by the first and the last stage)."""
    size, total, n = path.stat().st_size, _file_tensor_bytes(model), len(pc.stages)
    stats = pc.stage_stats()
    for s in stats:
        print(f"\nstage {s['index']}/{n} layers {s['layers']}: weights {s['weight_bytes'] / 2**20:.1f} MiB, "
              f"file pages resident {s['file_rss_bytes'] / 2**20:.1f} of {size / 2**20:.1f} MiB, "
              f"rss {s['rss_bytes'] / 2**20:.0f} MiB")  # fmt: skip
        assert s["weight_bytes"] < total * (0.7 if n == 2 else 0.6)
        assert 0 < s["file_rss_bytes"] < size * (0.7 if n == 2 else 0.6)
    if n == 3:  # the middle stage holds neither embedding nor head: a third of the layers
        assert stats[1]["weight_bytes"] < total * 0.3 and stats[1]["file_rss_bytes"] < size * 0.3
    return stats


PROMPT_TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2_ref(smollm2_path: Path) -> dict[str, Any]:
    """The single process: greedy text, and logits of ``_run``."""
    from llamapy import Llama

    ref = Llama(str(smollm2_path), n_ctx=256, n_threads=1, n_ubatch=8, verbose=False)
    text = ref.create_completion(PROMPT_TEXT, max_tokens=8, temperature=0)["choices"][0]["text"]
    logits, toks = _run(ref.ctx, n_gen=3)
    return {"text": text, "logits": logits, "toks": toks}


def test_smollm2_three_stages_llama(ray_local: None, smollm2_path: Path, smollm2_ref: dict[str, Any]) -> None:
    from llamapy import Llama

    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=1, n_ubatch=8, verbose=False, pipeline_stages=3,
                pipeline_options={"stage_cpus": 0.5})  # fmt: skip
    pc = llm.ctx
    try:
        got = llm.create_completion(PROMPT_TEXT, max_tokens=8, temperature=0)["choices"][0]["text"]
        assert got == smollm2_ref["text"] and got.strip()
        logits, toks = _run(pc, n_gen=3)
        assert toks == smollm2_ref["toks"]
        assert max(map(_rel, logits, smollm2_ref["logits"])) <= 1e-6
        assert pc.micro_batches  # the 10-token prompt went as micro-batches of 8 and 2 tokens
        # a batch whose second micro-batch is bad: a BatchError, the first one's cells taken back
        n0 = pc.memory.seq_pos_max(0)
        bad = Batch.from_tokens(list(range(16)), pos0=0)
        bad.pos = np.r_[np.arange(n0 + 1, n0 + 9), np.arange(n0 + 20, n0 + 28)].astype(np.int32)
        with pytest.raises(BatchError):
            pc.decode(bad)
        assert pc.memory.seq_pos_max(0) == n0 and pc.health()["ok"]
        _weight_shares(pc, llm.model, smollm2_path)
    except BaseException:
        pc.close()
        raise
    _kill_mid_decode(pc)  # lose the middle stage while a prompt goes through: a clear error, no hang


def test_smollm2_two_stages_serve(ray_local: None, smollm2_path: Path, smollm2_ref: dict[str, Any]) -> None:
    """``llamapy serve --pipeline 2`` over a real socket, the official openai client."""
    import httpx
    import openai
    import ray

    from llamapy.cli import build_parser
    from llamapy.cli.serve import make_app
    from tests.server.conftest import serve_app, wait_ready

    args = build_parser("serve").parse_args(
        [
            "serve",
            "-m",
            str(smollm2_path),
            "--pipeline",
            "2",
            "-t",
            "1",
            "-c",
            "256",
            "-ub",
            "8",
            "--no-warmup",
        ]
    )
    t0 = time.monotonic()
    app: Any = make_app(args, [], str(smollm2_path))
    base, server, thread = serve_app(app)
    try:
        wait_ready(base, timeout=120)
        print(f"\nserve --pipeline 2: ready in {time.monotonic() - t0:.1f} s")
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        r = c.completions.create(model="m", prompt=PROMPT_TEXT, max_tokens=8, temperature=0)
        assert r.choices[0].text == smollm2_ref["text"]
        backend = app.state.server.backend
        pc = backend.ctx
        assert isinstance(pc, PipelineContext)
        _weight_shares(pc, backend.model, smollm2_path)
        ray.kill(pc.stages[1])  # a node lost: the request fails clearly, /health says so
        t1 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as ei:
            c.completions.create(model="m", prompt="Another prompt", max_tokens=4, temperature=0)
        dt = time.monotonic() - t1
        print(f"after a stage was lost: HTTP {ei.value.status_code} in {dt:.1f} s: {ei.value.message}")
        assert ei.value.status_code == 503 and "stage 1" in str(ei.value.message) and dt < 30
        h = httpx.get(base + "/health", timeout=10)  # answered at once, with the pipeline's state
        assert h.status_code == 503 and "stage 1" in h.json()["error"]["message"], h.text
    finally:
        server.should_exit = True
        thread.join(10)
        pc = getattr(app.state.server.backend, "ctx", None)
        if isinstance(pc, PipelineContext):
            pc.close()


def _kill_mid_decode(pc: PipelineContext) -> None:
    import ray

    out: dict[str, Any] = {}
    # 240 tokens = 30 micro-batches of 8 over 3 stages: about 1 s on a quiet machine (64 tokens were done
    # before the kill there), so the kill 0.1 s in lands mid-prompt
    long = Batch.from_tokens(list(range(100, 340)), pos0=0)

    def go() -> None:
        try:
            pc.memory.seq_rm(0, -1, -1)
            pc.decode(long)
            out["ok"] = True
        except Exception as e:  # noqa: BLE001 (the test inspects it)
            out["err"] = e

    th = threading.Thread(target=go)
    t0 = time.monotonic()
    th.start()
    time.sleep(0.1)
    ray.kill(pc.stages[1])
    th.join(60)
    dt = time.monotonic() - t0
    try:
        assert not th.is_alive(), "decode hung after a stage was lost"
        assert isinstance(out.get("err"), PipelineError), out
        assert "stage 1" in str(out["err"]) and "layers 10-19" in str(out["err"])
        print(f"\nstage lost mid-decode: PipelineError after {dt:.1f} s: {out['err']}")
        assert pc.health()["ok"] is False and "stage 1" in pc.health()["error"]
        t1 = time.monotonic()
        with pytest.raises(PipelineError, match="down"):
            pc.decode(Batch.from_tokens([1], pos0=0))
        assert time.monotonic() - t1 < 5
    finally:
        pc.close()


def test_a_stage_that_cannot_read_its_file(
    ray_local: None, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    import ray

    from llamapy.ray.pipeline_stage import PipelineStage, StageFailure

    with pytest.raises(StageFailure, match="missing.gguf: model file not found"):  # the stage's own report
        PipelineStage(1, str(tmp_path / "missing.gguf"), 2, 3, dict(CP)).ready()
    model = Model.load(tiny_files["moe"])
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(tiny_files["moe"].read_bytes()[:5000])
    t0 = time.monotonic()
    with pytest.raises(PipelineError, match=r"stage 1 \(layers 2-2\).*ModelLoadError.*truncated.gguf") as ei:
        PipelineContext(model, 2, dict(CP), paths=[str(tiny_files["moe"]), str(bad)])
    print(f"\na stage given a truncated file: {time.monotonic() - t0:.1f} s: {ei.value}")
    deadline = time.monotonic() + 20  # the stages and their placement group are gone (asynchronously)
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_placement_that_cannot_be_met(ray_local: None, tiny_files: dict[str, Path]) -> None:
    model = Model.load(tiny_files["moe"])
    with pytest.raises(PipelineError, match="STRICT_SPREAD"):  # two nodes needed, one here
        PipelineContext(model, 2, dict(CP), strategy="STRICT_SPREAD", ready_timeout_s=2)
    with pytest.raises(PipelineError, match="4 stages"):
        PipelineContext(model, 4, dict(CP))
    with pytest.raises(PipelineError, match="strategy"):
        PipelineContext(model, 2, dict(CP), strategy="ANYWHERE")


def test_without_ray_and_bad_cli_combinations(
    tiny_files: dict[str, Path],
    smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    import sys

    from llamapy.cli import main
    from llamapy.ray import RayNotInstalledError

    rc = main(["serve", "-m", str(smollm2_path), "--pipeline", "2", "--embedding"])
    assert rc == 1 and "error: --pipeline does not work with --embedding" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(RayNotInstalledError, match=r"pip install 'llamapy\[ray\]'"):
        PipelineContext(Model.load(tiny_files["moe"]), 2, dict(CP))
    rc = main(["serve", "-m", str(smollm2_path), "--pipeline", "2"])
    assert rc == 1 and "pip install 'llamapy[ray]'" in capsys.readouterr().err
