"""n_gpu_layers on a tiny random llama: split graphs (some layers on the CUDA backend, run by the
simulator) give the CPU's logits; the KV cache of offloaded layers lives on the device."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.batch import Batch
from llamapy.context import Context
from llamapy.ggml.cuda.offload import plan_offload
from llamapy.model import Model
from tests.model.tiny import tiny_llama

TOKS = [1, 5, 9, 2, 33, 7]
#: the CPU's one-token decode quantizes Q8_0 activations to 16 bits (``q16_kernels``) where the device
#: multiplies floats: ~2.5e-4 of the largest logit apart on this random model (1e-4 before); its prompt rows
#: too since Q8_0 weights are repacked (``q80_x8``: 1.8e-4 on the tiny Gemma 3 below)
TOL = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Model.load(
        tiny_llama(
            tmp_path_factory.mktemp("cuda") / "t.gguf",
            seed=3,
            ggml_type="q8_0",
            n_layer=3,
            n_embd=32,
            n_ff=48,
        )
    )


def logits(model, ngl, **kw):
    """Prompt of 4, then 2 tokens one at a time (the decode path), all rows."""
    c = Context(model, n_ctx=256, n_gpu_layers=ngl, **kw)
    c.decode(Batch.from_tokens(TOKS[:4], logits_all=True))
    rows = [c.get_logits().copy()]
    for t in TOKS[4:]:
        c.decode(Batch.from_tokens([t]))
        rows.append(c.get_logits().copy())
    return c, np.concatenate(rows)


@pytest.fixture(scope="module")
def cpu_ref(tiny):
    return logits(tiny, 0)[1]


@pytest.mark.parametrize("ngl", [1, 3, -1])
def test_split_graph_matches_cpu(tiny, cpu_ref, ngl, capsys):
    c, got = logits(tiny, ngl)
    assert c.offload is not None and c.offload.n_gpu == min(3, 3 if ngl < 0 else ngl)
    assert c.offload.output == (ngl == -1)
    names = {sp.backend.name for g in c._graphs.values() for sp in c.sched.splits(g.graph)}
    assert names == {"cpu", "cuda"}
    rel = np.abs(got - cpu_ref).max() / np.abs(cpu_ref).max()
    assert rel < TOL, rel
    assert "offloaded" in capsys.readouterr().err


def test_no_kv_offload_and_state_roundtrip(tiny, cpu_ref):
    c, got = logits(tiny, -1, offload_kqv=False)
    assert c.offload.buffers == []
    assert np.abs(got - cpu_ref).max() / np.abs(cpu_ref).max() < TOL
    c2, _ = logits(tiny, -1)  # KV on the device: saving the state reads it back from the device
    state = c2.memory.state_write()
    ref, _ = logits(tiny, 0)
    ref.decode(Batch.from_tokens([11]))
    for ngl in (0, -1):  # ... and loading it writes it to the device again
        c3 = Context(tiny, n_ctx=256, n_gpu_layers=ngl)
        c3.memory.state_read(state)
        c3.decode(Batch.from_tokens([11], pos0=len(TOKS)))
        want = ref.get_logits()
        assert np.abs(c3.get_logits() - want).max() / np.abs(want).max() < TOL, ngl


def test_plan_offload_places_last_layers(tiny):
    w = tiny.impl.w
    off = plan_offload(w, [], 3, 2, True)
    names = {n for n, t in w.items() if any(t is x for x in off.weights)}
    assert names and all(n.startswith(("blk.1.", "blk.2.")) for n in names) and not off.output
    assert plan_offload(w, [], 3, 99, True).output
    with pytest.raises(Exception, match="n_gpu_layers"):
        plan_offload(w, [], 3, -5, True)


def test_model_that_does_not_fit_names_the_bytes(tiny, monkeypatch):
    from llamapy.errors import LlamapyError
    from llamapy.ggml.cuda.device import Device

    monkeypatch.setattr(Device, "free_bytes", lambda self: 1000)
    with pytest.raises(LlamapyError, match=r"need \d+ bytes .* has 1000 free"):
        Context(tiny, n_ctx=256, n_gpu_layers=-1)


def test_without_cuda_one_warning_then_cpu(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "from llamapy.batch import Batch\nfrom llamapy.context import Context\nfrom llamapy.model import Model\n"
        "from tests.model.tiny import tiny_llama\n"
        f"m = Model.load(tiny_llama({str(tmp_path / 't.gguf')!r}, n_layer=1, n_embd=32, n_ff=32))\n"
        "for _ in range(2):\n    c = Context(m, n_ctx=256, n_gpu_layers=-1)\n    c.decode(Batch.from_tokens([1, 2]))\n"
        "print([b.name for b in c.sched.backends])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_CUDA_DRIVER"] = str(tmp_path / "no-such-libcuda.so")  # no driver even on a GPU machine
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=os.getcwd())
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "n_gpu_layers" in ln]
    assert len(warn) == 1 and "ignored" in warn[0] and "-1" in warn[0], r.stderr
    assert r.stdout.strip() == "['cpu']"


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    pytest.importorskip("transformers")
    from llamapy.ggml.types import GGMLType
    from tests.model.hf_tiny import FAMILIES, make_tiny

    tm = make_tiny(FAMILIES["gemma3"], tmp_path_factory.mktemp("g3"), seed=1)
    return Model.load(tm.write(GGMLType.Q8_0))


def test_gemma3_sliding_window_split_matches_cpu(tiny_gemma3):
    """Gemma 3 (sliding window 4 < the prompt, tied output, post-norms, GELU) at two -ngl values."""

    def run(ngl):
        c = Context(tiny_gemma3, n_ctx=256, n_gpu_layers=ngl)
        c.decode(Batch.from_tokens([1, 5, 9, 2, 7, 3], logits_all=True))
        rows = [c.get_logits().copy()]
        c.decode(Batch.from_tokens([33]))
        return np.concatenate([*rows, c.get_logits()])

    ref = run(0)
    for ngl in (2, -1):
        got = run(ngl)
        assert np.abs(got - ref).max() / np.abs(ref).max() < TOL, ngl


def test_tied_output_goes_to_the_gpu_with_all_layers(tiny_gemma3):
    w = tiny_gemma3.impl.w
    assert "output.weight" not in w
    assert any(t is w["token_embd.weight"] for t in plan_offload(w, [], 6, -1, True).weights)
    assert not any(t is w["token_embd.weight"] for t in plan_offload(w, [], 6, 6, True).weights)


def test_llama_api_and_cli_flags_reach_the_context(tmp_path):
    from llamapy import Llama
    from llamapy.cli.common import llama_kwargs

    path = tiny_llama(tmp_path / "api.gguf", seed=4, n_layer=2, n_embd=32, n_ff=32)
    llm = Llama(str(path), n_gpu_layers=1, offload_kqv=False, verbose=False, n_ctx=256)
    assert llm.ctx.offload is not None and llm.ctx.offload.n_gpu == 1 and llm.ctx.offload.buffers == []
    import argparse

    from llamapy.cli import common

    p = argparse.ArgumentParser()
    common.add_model_args(p)
    args = p.parse_args(["-ngl", "99", "-nkvo", "-mg", "0"])
    kw = llama_kwargs(
        argparse.Namespace(**{**vars(args), "context_shift": True, "seed": 0, "verbose": False})
    )
    assert kw["n_gpu_layers"] == 99 and kw["offload_kqv"] is False and kw["main_gpu"] == 0


def test_state_read_into_a_context_whose_graphs_are_compiled(tiny):
    """Loading a state after decoding (graphs compiled, KV on the device) must reach those graphs."""
    src, _ = logits(tiny, -1)
    state = src.memory.state_write()
    src.decode(Batch.from_tokens([11]))
    want = src.get_logits().copy()
    c = Context(tiny, n_ctx=256, n_gpu_layers=-1)  # other tokens through the same graph shapes
    c.decode(Batch.from_tokens([3, 4, 8, 12], logits_all=True))
    for t in (2, 6, 11):
        c.decode(Batch.from_tokens([t]))
    c.memory.clear()
    c.memory.state_read(state)
    c.decode(Batch.from_tokens([11], pos0=len(TOKS)))
    assert np.abs(c.get_logits() - want).max() / np.abs(want).max() < 1e-4


def test_not_fitting_counts_the_kv_cache_of_offloaded_layers(tiny, monkeypatch):
    """Room for the weights but not for the weights and the KV cache: the error names both; without
    KV offload the same room is enough."""
    from llamapy.errors import LlamapyError
    from llamapy.ggml.cuda.device import Device

    c = Context(tiny, n_ctx=256, n_gpu_layers=2)
    room = c.offload.weight_bytes + 16
    assert c.offload.buffer_bytes > 16
    monkeypatch.setattr(Device, "free_bytes", lambda self: room)
    with pytest.raises(LlamapyError, match=r"n_gpu_layers = 2: the 2 offloaded layers need (\d+) bytes") as e:
        Context(tiny, n_ctx=256, n_gpu_layers=2)
    need = int(str(e.value).split("need ")[1].split(" bytes")[0])
    assert need == c.offload.weight_bytes + c.offload.buffer_bytes
    assert "MiB of KV cache" in str(e.value) and f"has {room} free" in str(e.value)
    assert "--no-kv-offload" in str(e.value)
    c2 = Context(tiny, n_ctx=256, n_gpu_layers=2, offload_kqv=False)
    assert c2.offload.buffers == [] and c2.offload.need_bytes <= room


def test_load_line_says_what_went_where(tiny, capsys):
    Context(tiny, n_ctx=256, n_gpu_layers=2, main_gpu=0)
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "offloaded" in ln)
    from llamapy.ggml.cuda.device import get_device

    name = get_device().name  # "CUDA simulator", or the GPU's name with LLAMAPY_CUDA_REAL=1
    assert f"offloaded 2/3 layers (blk.1-blk.2) to {name} (GPU 0)" in line, line
    assert "iB of weights on the GPU" in line and "iB on the CPU" in line
    assert "KV cache of the offloaded layers on the GPU" in line
    Context(tiny, n_ctx=256, n_gpu_layers=-1, offload_kqv=False)
    line = next(ln for ln in capsys.readouterr().err.splitlines() if "offloaded" in ln)
    assert "3/3 layers (blk.0-blk.2) and the output layer" in line and "KV cache on the CPU" in line, line


def test_bench_with_ngl_and_no_kv_offload(tmp_path):
    from llamapy.cli.bench import bench, markdown

    path = tiny_llama(tmp_path / "b.gguf", seed=2, n_layer=2, n_embd=32, n_ff=32)
    recs = bench(str(path), [3], [2], reps=1, n_gpu_layers=1, main_gpu=0, offload_kqv=False)
    assert [r["backends"] for r in recs] == ["CUDA", "CUDA"]
    assert all(r["n_gpu_layers"] == 1 and r["no_kv_offload"] and r["gpu_info"] for r in recs)
    assert "CUDA" in markdown(recs)


def test_cli_bench_ngl_without_cuda_warns_once(tmp_path):
    """`llamapy bench -ngl 99` where CUDA is not usable: one warning line for two contexts, CPU results."""
    import os
    import subprocess
    import sys

    path = tiny_llama(tmp_path / "c.gguf", seed=2, n_layer=1, n_embd=32, n_ff=32)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_CUDA_DRIVER"] = str(tmp_path / "no-such-libcuda.so")  # no driver even on a GPU machine
    cmd = [sys.executable, "-m", "llamapy", "bench", "-m", str(path), "-p", "3", "-n", "2", "-r", "1"]
    r = subprocess.run(
        [*cmd, "-ngl", "99", "-nkvo", "1", "-mg", "0"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "n_gpu_layers" in ln]
    assert len(warn) == 1 and "n_gpu_layers = 99 ignored" in warn[0] and "running on the CPU" in warn[0], (
        r.stderr
    )
    rows = [ln for ln in r.stdout.splitlines() if "pp3" in ln or "tg2" in ln]
    assert len(rows) == 2 and all("| CPU |" in ln for ln in rows), r.stdout


def test_bad_main_gpu_is_an_error(tiny):
    from llamapy.errors import LlamapyError

    with pytest.raises(LlamapyError, match=r"main_gpu = -2: must be a GPU index >= 0"):
        Context(tiny, n_ctx=256, n_gpu_layers=1, main_gpu=-2)
