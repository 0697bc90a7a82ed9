"""The decode fast steps of the CPU backend (``cpu/plan_steps.py``): the same bytes as the general
steps, the errors of the general steps, and actually used for decode-shaped graphs."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.cpu import plan_steps
from llamapy.ggml.cpu.backend import CPUBackend

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
RNG = np.random.default_rng(7)


def _build(kv_type: T, n_rows: int, width: int, ffn: int):
    """K/V-cache writes of ``n_rows`` rows and a swiglu + geglu over [n_rows, ffn]."""
    cache = ops.buffer(f"cache_{kv_type.name}_{n_rows}_{width}", kv_type, (8, width))
    src = ops.new_tensor(T.F32, (n_rows, width))
    idx = ops.new_tensor(T.I32, (n_rows,))
    a, b = ops.new_tensor(T.F32, (n_rows, ffn)), ops.new_tensor(T.F32, (n_rows, ffn))
    wr = ops.set_rows(cache, src, idx)
    outs = [ops.cont(ops.view(wr, (8, width))), ops.swiglu(a, b), ops.geglu(a, b)]
    return cache, Graph(outs), (src, idx, a, b)


def _run(enabled: bool, kv_type: T, n_rows: int, feeds_v, width=64, ffn=96):
    plan_steps.ENABLED = enabled
    try:
        cache, g, (src, idx, a, b) = _build(kv_type, n_rows, width, ffn)
        cache.data[...] = 0
        s = Scheduler([CPUBackend(1)])
        sv, iv, av, bv = feeds_v
        s.compute(g, {src: sv, idx: iv, a: av, b: bv})
        names = [getattr(st, "__qualname__", "") for st in s._last.steps]
        return [s.get(o).tobytes() for o in g.outputs], names
    finally:
        plan_steps.ENABLED = True


def _feeds(n_rows: int, width=64, ffn=96, special=False):
    sv = (RNG.standard_normal((n_rows, width)) * 3).astype(np.float32)
    if special:  # overflow to inf, subnormal halves, exact ties, signed zeros
        flat = sv.reshape(-1)
        flat[:8] = [7e4, -7e4, 65519.0, 65520.0, 2.0**-25, 3 * 2.0**-26, 2.0**-20 + 2.0**-31, -0.0]
        flat[8:12] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, -(2 + 2.0**-10), 2.0**-24 * 1.5]  # ties to even
    iv = RNG.permutation(8)[:n_rows].astype(np.int32)
    av = (RNG.standard_normal((n_rows, ffn)) * 6).astype(np.float32)
    bv = RNG.standard_normal((n_rows, ffn)).astype(np.float32)
    return sv, iv, av, bv


@pytest.mark.parametrize("kv_type", [T.F16, T.F32])
@pytest.mark.parametrize("n_rows", [1, 3])
def test_fast_steps_same_bytes_and_used(kv_type, n_rows):
    feeds = _feeds(n_rows, special=True)
    fast, names = _run(True, kv_type, n_rows, feeds)
    slow, slow_names = _run(False, kv_type, n_rows, feeds)
    assert fast == slow
    want = "step_f16" if kv_type == T.F16 else "step_same"
    assert any(want in n for n in names), names
    assert sum("glu_step" in n for n in names) == 2, names
    assert not any("step_f16" in n or "step_same" in n or "glu_step" in n for n in slow_names)


def test_nan_falls_back_to_numpy():
    feeds = _feeds(2)
    feeds[0].reshape(-1)[5] = np.float32("nan")
    feeds[0].reshape(-1)[70] = -np.float32("nan")
    fast, _ = _run(True, T.F16, 2, feeds)
    slow, _ = _run(False, T.F16, 2, feeds)
    assert fast == slow


@pytest.mark.parametrize("kv_type", [T.F16, T.F32])
def test_bad_row_index_is_an_error_and_writes_nothing(kv_type):
    feeds = _feeds(2)
    feeds[1][:] = [3, 8]
    cache, g, (src, idx, a, b) = _build(kv_type, 2, 64, 96)
    cache.data[...] = 0
    s = Scheduler([CPUBackend(1)])
    with pytest.raises(ComputeError, match=r"row index 8 \(at 1\) not in 0..7"):
        s.compute(g, dict(zip((src, idx, a, b), feeds, strict=True)))
    assert not cache.data.any()
    names = [getattr(st, "__qualname__", "") for st in s._cache[g].steps]
    assert any("step_f16" in n or "step_same" in n for n in names), names


def test_large_glu_keeps_the_parallel_kernel():
    n = plan_steps.GLU_SERIAL_MAX // 96 + 1
    a, b = ops.new_tensor(T.F32, (n, 96)), ops.new_tensor(T.F32, (n, 96))
    g = Graph([ops.swiglu(a, b)])
    s = Scheduler([CPUBackend(1)])
    s.compute(g, {a: np.ones((n, 96), np.float32), b: np.ones((n, 96), np.float32)})
    assert not any("glu_step" in getattr(st, "__qualname__", "") for st in s._last.steps)


def test_tiny_llama_decode_uses_fast_steps_with_identical_logits(tmp_path):
    """A model's decode graph takes the fast steps (F16 cache writes, serial swiglu) and its logits are
    the general steps' bytes, token after token."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    model = Model.load(tiny_llama(tmp_path / "tiny.gguf", seed=3))
    logits, names = {}, {}
    for enabled in (False, True):
        plan_steps.ENABLED = enabled
        try:
            c = Context(model, ContextParams(n_ctx=64, n_threads=1))  # F16 cache (the default)
            c.decode(Batch.from_tokens([5, 17, 3, 42], pos0=0))
            rows = [c.get_logits().tobytes()]
            for i, t in enumerate([8, 21, 33]):
                c.decode(Batch.from_tokens([t], pos0=4 + i))
                rows.append(c.get_logits().tobytes())
        finally:
            plan_steps.ENABLED = True
        logits[enabled] = rows
        names[enabled] = [getattr(s, "__qualname__", "") for s in c.sched._last.steps]
    assert logits[True] == logits[False]
    assert sum("step_f16" in n for n in names[True]) >= 2, names[True]  # K and V of each layer
    assert any("glu_step" in n for n in names[True]), names[True]
    assert sum("add_norm_step" in n for n in names[True]) >= 2, names[True]  # two residual adds a layer
    assert not any("step_f16" in n or "glu_step" in n or "add_norm_step" in n for n in names[False])


@pytest.mark.parametrize("seed", range(6))
def test_short_context_attention_same_bytes(seed):
    """Decode attention over only the used cells of a padded cache view: the same bytes as the kernel over
    the whole view (1-4 query rows, holes in the mask, one or two chunks of keys, a softcap)."""
    from llamapy._numba import set_num_threads
    from llamapy.ggml.cpu.attn_decode import attn_group_f16x8, group_chunks
    from llamapy.ggml.cpu.plan_kernels import attn_short_keys

    rng = np.random.default_rng(seed)
    tried = 0
    for case in range(12):
        H, Hkv, D = [(9, 3, 64), (4, 2, 32), (8, 2, 128)][case % 3]
        KV, T = int(rng.choice([256, 384, 512])), int(rng.integers(1, 5))
        used = int(rng.integers(0, 140)) if case % 4 else int(rng.integers(0, KV + 1))
        q = (rng.standard_normal((T, H, D)) * 2).astype(np.float32)
        k, v = (rng.standard_normal((KV * Hkv * D,)).astype(np.float16).view(np.uint16) for _ in "kv")
        mask = np.full((T, KV), -np.inf, np.float32)
        for t in range(T):
            mask[t, : max(0, used - (T - 1 - t))] = 0
        if case % 5 == 0:
            mask[:, rng.integers(0, KV, 5)] = -np.inf
        sl, cap = np.ones(H, np.float32), np.float32(30.0 if case % 2 else 0.0)
        n_chunks = group_chunks(KV, 1 + case % 2)
        set_num_threads(1 + case % 2)
        ref, got = np.empty((T, H, D), np.float32), np.full((T, H, D), 7.0, np.float32)
        attn_group_f16x8(q, k, v, mask, True, np.float32(0.125), cap, sl, ref, Hkv, D, n_chunks)
        n = attn_short_keys(mask, True, KV, n_chunks)
        assert n <= KV and (n == KV or not np.any(mask[:, n:] != -np.inf))
        if n < KV:
            tried += 1
            m, row = np.ascontiguousarray(mask[:, :n]), Hkv * D
            attn_group_f16x8(
                q, k[: n * row], v[: n * row], m, True, np.float32(0.125), cap, sl, got, Hkv, D, 1
            )
            assert got.tobytes() == ref.tobytes(), (H, KV, T, used, n_chunks)
    set_num_threads(None)
    assert tried >= 4


@pytest.mark.parametrize("threads", [1, 2])
def test_tiny_llama_short_context_attention_identical_logits(tmp_path, threads):
    """A 256-cell cache (the padded view) with a few tokens: the decode attention reads the used part
    only, and the logits are the bytes of the attention over the whole view."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from tests.model.tiny import tiny_llama

    model = Model.load(tiny_llama(tmp_path / "tiny.gguf", seed=5))
    logits, names = {}, {}
    for enabled in (False, True):
        plan_steps.ENABLED = enabled
        try:
            c = Context(model, ContextParams(n_ctx=256, n_threads=threads))
            c.decode(Batch.from_tokens([5, 17, 3, 42, 9], pos0=0))
            rows = [c.get_logits().tobytes()]
            for i, t in enumerate([8, 21, 33, 1]):
                c.decode(Batch.from_tokens([t], pos0=5 + i))
                rows.append(c.get_logits().tobytes())
        finally:
            plan_steps.ENABLED = True
        logits[enabled] = rows
        names[enabled] = [getattr(s, "__qualname__", "") for s in c.sched._last.steps]
    assert logits[True] == logits[False]
    import numba

    assert numba.get_num_threads() == min(threads, numba.config.NUMBA_NUM_THREADS)  # put back after each call
    assert sum("attn_group_step" in n for n in names[True]) == 2, names[True]
    assert not any("attn_group_step" in n for n in names[False])


def _residual_graph(n_rows: int, d: int, broadcast: bool = False, gap: bool = False):
    """``s = x + r; y = rms_norm(s) * w; z = s + y`` (a residual add, the next layer's norm, the residual
    used again), as in a llama decoder layer. ``broadcast``: r is one row; ``gap``: a node between the
    add and the norm."""
    x = ops.new_tensor(T.F32, (n_rows, d))
    r = ops.new_tensor(T.F32, (d,) if broadcast else (n_rows, d))
    w = ops.new_tensor(T.F32, (d,))
    s = ops.add(x, r)
    nrm = ops.rms_norm(s, 1e-5)
    y = ops.mul(nrm, ops.scale(w, 1.0) if gap else w)  # gap: the scale runs after the norm
    return Graph([y, ops.add(s, y)]), (x, r, w)


def _run_residual(enabled: bool, threads: int, n_rows: int, d: int, feeds, **kw):
    plan_steps.ENABLED = enabled
    try:
        g, ins = _residual_graph(n_rows, d, **kw)
        s = Scheduler([CPUBackend(threads)])
        s.compute(g, dict(zip(ins, feeds, strict=True)))
        names = [getattr(st, "__qualname__", "") for st in s._last.steps]
        return [s.get(o).tobytes() for o in g.outputs], names
    finally:
        plan_steps.ENABLED = True


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n_rows", "d"), [(1, 576), (1, 64), (3, 33), (2, 1000), (1, 4096)])
def test_add_norm_fused_same_bytes(threads, n_rows, d):
    """A residual add and the norm after it in one call: the bytes of the add step and the fused norm
    step (the sum, the normed row, and the sum's later use), with large, tiny and cancelling values."""
    x = (RNG.standard_normal((n_rows, d)) * 4).astype(np.float32)
    r = (RNG.standard_normal((n_rows, d)) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [3e38, 1e-40, 1.5, -7.25]
    r.reshape(-1)[:4] = [3e38, -1e-40, -1.5, 1e-3]
    w = RNG.standard_normal(d).astype(np.float32)
    fast, names = _run_residual(True, threads, n_rows, d, (x, r, w))
    slow, slow_names = _run_residual(False, threads, n_rows, d, (x, r, w))
    assert fast == slow
    assert sum("add_norm_step" in n for n in names) == 1, names
    assert len(names) == len(slow_names) - 1
    assert not any("add_norm_step" in n for n in slow_names)


@pytest.mark.parametrize("kw", [{"broadcast": True}, {"gap": True}])
def test_add_norm_not_fused_when_not_adjacent_or_broadcast(kw):
    d = 48
    x, w = RNG.standard_normal((2, d)).astype(np.float32), RNG.standard_normal(d).astype(np.float32)
    r = RNG.standard_normal(d if kw.get("broadcast") else (2, d)).astype(np.float32)
    fast, names = _run_residual(True, 1, 2, d, (x, r, w), **kw)
    slow, _ = _run_residual(False, 1, 2, d, (x, r, w), **kw)
    assert fast == slow
    assert not any("add_norm_step" in n for n in names), names


def test_begin_split_restores_a_thread_count_changed_in_between():
    """The split's thread count is read back each compute: a count set elsewhere between two computes
    (or by the short-context attention) does not stick."""
    import numba

    want = min(2, numba.config.NUMBA_NUM_THREADS)
    a, b = ops.new_tensor(T.F32, (1, 8)), ops.new_tensor(T.F32, (1, 8))
    g = Graph([ops.add(a, b)])
    s = Scheduler([CPUBackend(2)])
    feeds = {a: np.ones((1, 8), np.float32), b: np.ones((1, 8), np.float32)}
    s.compute(g, feeds)
    assert numba.get_num_threads() == want
    numba.set_num_threads(1)
    s.compute(g, feeds)
    assert numba.get_num_threads() == want
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
