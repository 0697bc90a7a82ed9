"""Launch plans (llamapy/ggml/cuda/plan.py): the first run of a device split records its launches, later
runs of the same graph replay them (on a GPU: as a CUDA graph). Replayed decodes must give exactly the
node walk's logits, over several decodes whose n_kv changes (a new n_kv is a new graph: a new plan)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from llamapy.batch import Batch
from llamapy.context import Context
from llamapy.ggml.cuda import plan as plan_mod
from llamapy.ggml.cuda.device import Device
from llamapy.model import Model
from tests.model.tiny import tiny_llama

PROMPT = [1, 5, 9]
DECODE = [2, 33, 7, 11, 3, 8, 20, 4, 6]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("replay") / "t.gguf"
    return Model.load(tiny_llama(path, seed=5, ggml_type="q8_0", n_layer=2, n_embd=32, n_ff=32))


@pytest.fixture
def small_pad(monkeypatch):
    """n_kv padded to 4 cells instead of 256, so that a few decodes cross several n_kv values."""
    from llamapy.memory import kv_cache

    monkeypatch.setattr(kv_cache, "N_PAD", 4)


def cuda_of(c: Context):
    return next(b for b in c.sched.backends if b.name == "cuda")


def run(model, monkeypatch, replay: bool = True, ngl: int = -1, rm_back: bool = True):
    """The prompt, then DECODE one token at a time; then back to position 5 (seq_rm) and on again, so
    an earlier n_kv's graph is used once more. Returns the context and every logits row."""
    monkeypatch.setenv("LLAMAPY_CUDA_REPLAY", "1" if replay else "0")
    c = Context(model, n_ctx=64, n_gpu_layers=ngl)
    c.decode(Batch.from_tokens(PROMPT, logits_all=True))
    rows = [c.get_logits().copy()]
    for i, t in enumerate(DECODE):
        c.decode(Batch.from_tokens([t], pos0=len(PROMPT) + i))
        rows.append(c.get_logits().copy())
    if rm_back:
        c.memory.seq_rm(0, 5, -1)
        for i, t in enumerate(DECODE[:3]):
            c.decode(Batch.from_tokens([t + 1], pos0=5 + i))
            rows.append(c.get_logits().copy())
    return c, np.concatenate(rows)


def device_splits(c: Context) -> int:
    return sum(sp.backend.name == "cuda" for g in c._graphs.values() for sp in c.sched.splits(g.graph))


@pytest.fixture(scope="module")
def walked(tiny):
    mp = pytest.MonkeyPatch()
    from llamapy.memory import kv_cache

    mp.setattr(kv_cache, "N_PAD", 4)
    try:
        c, rows = run(tiny, mp, replay=False)
        cpu = run(tiny, mp, ngl=0)[1]
        return cuda_of(c).stats.copy(), rows, cpu
    finally:
        mp.undo()


def test_replay_is_identical_to_the_node_walk(tiny, walked, small_pad, monkeypatch):
    wstats, want, cpu = walked
    assert wstats["replays"] == 0 and wstats["records"] > wstats["plans"]  # every run walked the nodes
    c, got = run(tiny, monkeypatch)
    st = cuda_of(c).stats
    np.testing.assert_array_equal(got, want)  # bit for bit: the same launches, replayed
    # (the CPU multiplies Q8_0 weights by 16-bit activations, the device by floats: 1.1e-4 measured)
    assert np.abs(got - cpu).max() / np.abs(cpu).max() < 1e-3
    # the decodes crossed several n_kv values (4, 8, 12): a prompt graph and three decode graphs
    assert len(c._graphs) == c.n_graph_builds >= 4, list(c._graphs)
    # one plan per device split of each graph, each recorded once; every other run replayed
    assert st["plans"] == device_splits(c) == st["records"]
    runs = 1 + len(DECODE) + 3  # each graph here has the same number of device splits
    assert st["replays"] > 0 and st["replays"] + st["records"] == runs * device_splits(c) // len(c._graphs)
    assert st["launches"] == wstats["launches"]  # the same number of kernel launches either way
    assert c.n_graph_reuses > 0


def test_a_graph_with_a_new_n_kv_gets_its_own_plan(tiny, small_pad, monkeypatch):
    c = Context(tiny, n_ctx=64, n_gpu_layers=-1)
    be = cuda_of(c)
    c.decode(Batch.from_tokens([1, 2, 3]))  # prompt graph (3 tokens, n_kv 4)
    c.decode(Batch.from_tokens([4], pos0=3))  # decode graph, n_kv 4
    plans = be.stats["plans"]
    c.decode(Batch.from_tokens([5], pos0=4))  # n_kv 8: a new graph, recorded
    assert be.stats["plans"] > plans and be.stats["replays"] == 0
    plans = be.stats["plans"]
    c.decode(Batch.from_tokens([6], pos0=5))  # n_kv 8 again: replayed
    assert be.stats["plans"] == plans and be.stats["replays"] == device_splits(c) // len(c._graphs)


class FakeGraph:
    """What CUDA does with a captured stream: nothing runs at capture, everything at each launch."""

    def __init__(self, run):
        self.run, self.launches = run, 0

    def launch(self):
        self.launches += 1
        self.run()


def test_cuda_graph_path_with_a_fake_capture(tiny, walked, small_pad, monkeypatch):
    monkeypatch.setattr(Device, "can_capture", lambda self: True)
    monkeypatch.setattr(Device, "capture", lambda self, run: FakeGraph(run))
    monkeypatch.setattr(Device, "launch_graph", lambda self, g: g.launch())
    c, got = run(tiny, monkeypatch)
    st = cuda_of(c).stats
    np.testing.assert_array_equal(got, walked[1])
    assert st["replays"] == 0 and st["capture_failures"] == 0
    assert 0 < st["captures"] <= st["plans"] and st["graph_launches"] > st["captures"]
    monkeypatch.setenv("LLAMAPY_CUDA_GRAPHS", "0")  # graphs off: plain replay
    c2, got2 = run(tiny, monkeypatch, rm_back=False)
    assert cuda_of(c2).stats["captures"] == 0 and cuda_of(c2).stats["replays"] > 0


def test_failed_capture_logs_once_and_replays(tiny, walked, small_pad, monkeypatch, caplog):
    def fail(self, run):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(Device, "can_capture", lambda self: True)
    monkeypatch.setattr(Device, "capture", fail)
    monkeypatch.setattr(plan_mod, "_capture_logged", False)
    with caplog.at_level(logging.WARNING, logger="llamapy.ggml.cuda.plan"):
        c, got = run(tiny, monkeypatch)
    st = cuda_of(c).stats
    np.testing.assert_array_equal(got, walked[1])
    assert st["capture_failures"] >= 2 and st["graph_launches"] == 0 and st["replays"] > 0
    msgs = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
    assert len(msgs) == 1 and "not permitted" in msgs[0], msgs


def test_bad_index_on_a_replayed_run_still_raises(cuda_backend):
    """The index check sits outside the replay: a bad id on the 3rd run (replayed) is still an error."""
    from llamapy.ggml import GGMLType as T
    from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
    from llamapy.ggml.backend import ComputeError

    w = ops.weight("w_replay", T.F32, (4, 8), np.arange(32, dtype=np.float32).reshape(4, 8))
    ids = ops.new_tensor(T.I32, (2,))
    g = Graph([ops.get_rows(w, ids)])
    s = Scheduler([NumpyBackend(), cuda_backend])
    s.set_backend(g.nodes[0], cuda_backend)
    before = cuda_backend.stats["replays"]
    for good in ([1, 3], [0, 2]):
        s.compute(g, {ids: np.array(good, np.int32)})
        np.testing.assert_array_equal(s.get(g.outputs[0]), w.data[good])
    with pytest.raises(ComputeError, match="row index 7"):
        s.compute(g, {ids: np.array([7, 0], np.int32)})
    s.compute(g, {ids: np.array([3, 3], np.int32)})
    np.testing.assert_array_equal(s.get(g.outputs[0]), w.data[[3, 3]])
    assert cuda_backend.stats["replays"] - before == 3


def test_cuda_graph_on_a_real_gpu(tiny, walked, small_pad, monkeypatch):
    """GPU only: the replay captured into real CUDA graphs (CuPy) gives the plain replay's logits."""
    from llamapy.ggml.cuda.device import get_device

    dev = get_device()
    if dev.sim or not dev.can_capture():
        pytest.skip("needs a real GPU with CuPy (run with LLAMAPY_CUDA_REAL=1 on a CUDA machine)")
    monkeypatch.setenv("LLAMAPY_CUDA_GRAPHS", "0")
    plain = run(tiny, monkeypatch)[1]
    monkeypatch.setenv("LLAMAPY_CUDA_GRAPHS", "1")
    c, got = run(tiny, monkeypatch)
    st = cuda_of(c).stats
    assert st["capture_failures"] == 0 and st["graph_launches"] > 0, dict(st)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
