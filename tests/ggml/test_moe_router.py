"""``cpu/moe_router_kernels.py``: the serial float32 mat-vec of small weights (MoE routers) against
float64 and its NumPy twin, and ``matmul_steps`` running it for small float32 products at any thread
count (the same bits at one and two threads)."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.cpu import moe_router_kernels as mr
from llamapy.ggml.cpu.backend import CPUBackend

RNG = np.random.default_rng(5)


@pytest.mark.parametrize(("n", "k", "m"), [(128, 2048, 1), (128, 2048, 4), (7, 40, 2), (33, 8, 3), (5, 3, 1)])
def test_mv_f32_small_close_to_float64_and_numpy_twin(n, k, m):
    w = RNG.standard_normal((n, k), dtype=np.float32)
    x = RNG.standard_normal((m, k), dtype=np.float32)
    out, ref = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    mr.mv_f32_small(w, x, out)
    mr.mv_f32_small_ref(w, x, ref)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(out, exact, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_mv_f32_small_strided_rows_and_usable():
    w = RNG.standard_normal((16, 64), dtype=np.float32)
    wide = RNG.standard_normal((3, 80), dtype=np.float32)
    x = wide[:, 8:72]  # unit stride along the rows, row stride 80
    out = np.zeros((3, 40), np.float32)[:, 4:20]
    assert mr.usable(w, x, out)
    mr.mv_f32_small(w, x, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert not mr.usable(np.asfortranarray(w), x, out)
    assert not mr.usable(w, x[:, ::2], out)
    assert not mr.usable(w.astype(np.float64), x, out)


def _run(threads: int, w: np.ndarray, x: np.ndarray):
    wt = ops.new_tensor(T.F32, w.shape)
    xt = ops.new_tensor(T.F32, x.shape)
    g = Graph([ops.mul_mat(wt, xt)])
    s = Scheduler([CPUBackend(threads)])
    s.compute(g, {wt: w, xt: x})
    names = [getattr(st, "__qualname__", "") for st in s._last.steps]
    return s.get(g.outputs[0]).copy(), names


@pytest.mark.parametrize("m", [1, 4])
def test_mul_mat_runs_it_at_any_thread_count(m, monkeypatch):
    w = RNG.standard_normal((128, 256), dtype=np.float32)
    x = RNG.standard_normal((m, 256), dtype=np.float32)
    one, names1 = _run(1, w, x)
    two, names2 = _run(2, w, x)
    assert any("step_f32_serial" in nm for nm in names1 + names2)
    assert one.tobytes() == two.tobytes()
    direct = np.empty((m, 128), np.float32)
    mr.mv_f32_small(w, x, direct)
    assert one.tobytes() == direct.tobytes()
    monkeypatch.setattr(mr, "ENABLED", False)  # switched off: the sgemm as before
    off, _ = _run(1, w, x)
    np.testing.assert_allclose(off, one, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("ux", "t"), [(1, 1), (1, 3), (4, 2)])
def test_mm_id_f32_small_against_numpy(ux, t):
    a = RNG.standard_normal((6, 3, 20), dtype=np.float32)
    x = RNG.standard_normal((t, ux, 20), dtype=np.float32)
    ids = RNG.integers(0, 6, (t, 4)).astype(np.int32)
    out = np.full((t * 4, 3), np.nan, np.float32)
    assert mr.usable_id(a, x, out)
    assert mr.mm_id_f32_small(a, x, ids, out) == -1
    xs = np.broadcast_to(x, (t, 4, 20)).reshape(-1, 20).astype(np.float64)
    ref = np.einsum("pnk,pk->pn", a[ids.reshape(-1)].astype(np.float64), xs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    ids[t - 1, 2] = 6
    out[:] = 7.0
    assert mr.mm_id_f32_small(a, x, ids, out) == (t - 1) * 4 + 2
    assert (out == 7.0).all()  # nothing written


def _gather(threads: int, probs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The router's one-hot gather (``build_moe_ffn``): ``mul_mat_id(eye, probs, ids)``."""
    T_, E = probs.shape
    eye = ops.new_tensor(T.F32, (E, 1, E))
    pt = ops.new_tensor(T.F32, (T_, 1, E))
    it = ops.new_tensor(T.I32, ids.shape)
    g = Graph([ops.mul_mat_id(eye, pt, it)])
    s = Scheduler([CPUBackend(threads)])
    s.compute(g, {eye: np.eye(E, dtype=np.float32).reshape(E, 1, E), pt: probs.reshape(T_, 1, E), it: ids})
    names = [getattr(st, "__qualname__", "") for st in s._last.steps]
    return s.get(g.outputs[0]).copy(), names


@pytest.mark.parametrize("t", [1, 4, 6])
def test_one_hot_gather_exact(t, monkeypatch):
    probs = RNG.random((t, 128), dtype=np.float32)
    ids = np.stack([RNG.choice(128, 8, replace=False) for _ in range(t)]).astype(np.int32)
    want = np.take_along_axis(probs, ids.astype(np.int64), axis=1).reshape(t, 8, 1)
    got, names = _gather(2, probs, ids)
    assert got.tobytes() == want.tobytes()
    assert any("step_f32_small" in nm for nm in names)
    monkeypatch.setattr(mr, "ENABLED", False)  # the batched np.matmul as before: the same bits
    off, names = _gather(1, probs, ids)
    assert off.tobytes() == want.tobytes()
    assert not any("step_f32_small" in nm for nm in names)


def test_one_hot_gather_bad_id():
    from llamapy.ggml.backend import ComputeError

    probs = RNG.random((1, 16), dtype=np.float32)
    with pytest.raises(ComputeError, match="expert id 16"):
        _gather(1, probs, np.array([[3, 16]], np.int32))
