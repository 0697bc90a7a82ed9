"""``cpu/matmul_steps.py``: small float32 products run on the calling thread alone, with the bits of the
one-thread product, and put the thread count back."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, Scheduler, ops
from llamapy.ggml.cpu import matmul_steps
from llamapy.ggml.cpu.backend import CPUBackend

RNG = np.random.default_rng(11)


def _run(threads: int, n: int, k: int, m: int, feeds):
    w = ops.new_tensor(T.F32, (n, k))
    x = ops.new_tensor(T.F32, (m, k))
    g = Graph([ops.mul_mat(w, x)])
    s = Scheduler([CPUBackend(threads)])
    s.compute(g, {w: feeds[0], x: feeds[1]})
    names = [getattr(st, "__qualname__", "") for st in s._last.steps]
    return s.get(g.outputs[0]).copy(), names


@pytest.mark.parametrize(("n", "k", "m"), [(128, 2048, 1), (128, 2048, 3), (40, 64, 4), (257, 96, 2)])
def test_small_f32_product_serial_same_bits_as_one_thread(n, k, m):
    feeds = (RNG.standard_normal((n, k), dtype=np.float32), RNG.standard_normal((m, k), dtype=np.float32))
    one, _ = _run(1, n, k, m, feeds)
    two, names = _run(2, n, k, m, feeds)
    assert any("step_f32_serial" in nm for nm in names)
    assert one.tobytes() == two.tobytes()
    ref = feeds[1].astype(np.float64) @ feeds[0].astype(np.float64).T
    np.testing.assert_allclose(two, ref, rtol=1e-4, atol=1e-3)
    assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)  # put back


def test_large_or_many_rows_keep_the_parallel_product(monkeypatch):
    n, k = 64, 128
    feeds = (RNG.standard_normal((n, k), dtype=np.float32), RNG.standard_normal((8, k), dtype=np.float32))
    _, names = _run(2, n, k, 8, feeds)  # 8 rows > F32_SERIAL_ROWS
    assert not any("step_f32_serial" in nm for nm in names)
    monkeypatch.setattr(matmul_steps, "F32_SERIAL_MAX", n * k - 1)
    out, names = _run(2, n, k, 1, (feeds[0], feeds[1][:1]))
    assert not any("step_f32_serial" in nm for nm in names)
    np.testing.assert_allclose(out, feeds[1][:1] @ feeds[0].T, rtol=1e-4, atol=1e-4)
