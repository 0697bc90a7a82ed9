"""The fused experts kernels (``cpu.moe_kernels``, ``mul_mat_id`` of the k-quants in one call) against the
per-expert loop they replace (bit for bit: the same one-row kernel arithmetic per expert row) and against
the NumPy reference backend; the other types (32-element blocks, MXFP4) still run the loop."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.cpu import matmul_steps
from llamapy.ggml.cpu.backend import CPUBackend, matvec_max_rows
from llamapy.ggml.cpu.matmul_kernels import F16_TABLE, MATVEC
from llamapy.ggml.cpu.moe_kernels import MOE, moe_plan
from llamapy.ggml.quants import quantize

RNG = np.random.default_rng(77)
CPU = CPUBackend(2)
#: llama.cpp's test-backend-ops bound for kernels that quantize the activations
Q8_NMSE = 5e-4


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def experts(t: T, E: int, N: int, K: int):
    wf = RNG.standard_normal((E, N, K)).astype(np.float32)
    return ops.weight("experts", t, (E, N, K), quantize(wf, t))


def run(outs, feeds, be, fused=True):
    """``fused``: every batch through the fused kernel (also past ``MOE_FUSED_MAX_TOKENS``)."""
    old = matmul_steps.MOE_FUSED, matmul_steps.MOE_FUSED_MAX_TOKENS
    matmul_steps.MOE_FUSED, matmul_steps.MOE_FUSED_MAX_TOKENS = fused, 1 << 30
    try:
        s = Scheduler([be])
        s.compute(Graph(outs), feeds)
        return [np.array(s.get(o)) for o in outs]
    finally:
        matmul_steps.MOE_FUSED, matmul_steps.MOE_FUSED_MAX_TOKENS = old


def graph(t: T, E: int, N: int, K: int, iv: np.ndarray):
    Tn, U = iv.shape
    a = experts(t, E, N, K)
    b = ops.new_tensor(T.F32, (Tn, 1, K))  # gate/up: one row per token, shared by its experts
    b2 = ops.new_tensor(T.F32, (Tn, U, K))  # down: a row per (token, slot)
    ids = ops.new_tensor(T.I32, (Tn, U))
    feeds = {
        b: RNG.standard_normal((Tn, 1, K)).astype(np.float32),
        b2: RNG.standard_normal((Tn, U, K)).astype(np.float32),
        ids: iv.astype(np.int32),
    }
    return [ops.mul_mat_id(a, b, ids), ops.mul_mat_id(a, b2, ids)], feeds


@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K, T.Q4_0, T.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("Tn", [1, 7])
def test_fused_equals_loop_and_reference(t, Tn):
    E, N, K, U = 16, 13, 512, 4  # 13 rows: groups of four and a remainder; most experts get 0 rows
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)])
    outs, feeds = graph(t, E, N, K, iv)
    fused = run(outs, feeds, CPU, True)
    loop = run(outs, feeds, CPU, False)
    ref = run(outs, feeds, NumpyBackend())
    for f, lp, r in zip(fused, loop, ref, strict=True):
        if Tn == 1:  # one row per expert: the loop ran the same one-row kernel (the others: same path)
            np.testing.assert_array_equal(f, lp)
        else:  # the loop's batch kernel (2+ rows) rounds its float sums in another order
            assert nmse(f, lp) <= 1e-10
        assert nmse(f, r) <= Q8_NMSE


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K])
def test_many_rows_per_expert_take_the_tile_path(t):
    E, N, K, U = 4, 6, 256, 2
    Tn = matvec_max_rows(t.name) + 20
    iv = np.zeros((Tn, U), np.int64)
    iv[:, 1] = RNG.integers(1, E, Tn)  # expert 0: every token (tiles); the others: fewer (fused kernel)
    outs, feeds = graph(t, E, N, K, iv)
    fused = run(outs, feeds, CPU, True)
    loop = run(outs, feeds, CPU, False)
    ref = run(outs, feeds, NumpyBackend())
    for f, lp, r in zip(fused, loop, ref, strict=True):
        assert nmse(f, lp) <= 1e-10
        assert nmse(f, r) <= Q8_NMSE


def test_kernel_matches_one_row_kernel_per_expert_and_nan_rows():
    E, N, K, U, Tn = 8, 9, 256, 3, 5
    w = quantize(RNG.standard_normal((E * N, K)).astype(np.float32), T.Q4_K).reshape(E, N, -1)
    x = RNG.standard_normal((Tn, U, K)).astype(np.float32)
    x[2, 1, 7] = np.inf
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)]).astype(np.int32)
    out = np.full((Tn * U, N), -1.0, np.float32)
    assert MOE["Q4_K"](w, x, iv, out, F16_TABLE, 128) == -1
    for t in range(Tn):
        for u in range(U):
            y = np.empty((1, N), np.float32)
            MATVEC["Q4_K"](w[iv[t, u]], np.ascontiguousarray(x[t, u : u + 1]), y, F16_TABLE)
            np.testing.assert_array_equal(out[t * U + u], y[0])
    assert np.isnan(out[2 * U + 1]).all() and np.isfinite(np.delete(out, 2 * U + 1, axis=0)).all()


def test_plan_groups_pairs_by_expert():
    iv = np.array([[3, 0], [3, 1], [0, 3]], np.int32)
    bad, order, starts, active = moe_plan(iv, 5, 2)
    assert bad == -1
    assert list(starts) == [0, 2, 3, 3, 6, 6]
    assert list(order) == [1, 4, 3, 0, 2, 5]
    assert list(active) == [0, 1]  # expert 3 has 3 pairs > 2: left to the tile path; 2 and 4 have none
    assert moe_plan(np.array([[1, 7]], np.int32), 5, 2)[0] == 1  # the pair, not the id
    assert moe_plan(np.array([[0, 1], [-1, 1]], np.int32), 5, 2)[0] == 2


@pytest.mark.parametrize("t", [T.Q4_K, T.Q4_0])
@pytest.mark.parametrize("bad", [-1, 4])
def test_expert_id_out_of_range_is_a_compute_error(t, bad):
    iv = np.array([[0, 1], [2, bad]], np.int32)
    outs, feeds = graph(t, 4, 5, 256, iv)
    with pytest.raises(ComputeError, match=f"expert id {bad} not in 0..3"):
        run(outs, feeds, CPU, True)


@pytest.mark.parametrize("Tn", [1, 3])
def test_float_experts_batched_matmul(Tn):
    """F32 experts (the router's one-hot gather) for a few tokens: one batched matmul over the pairs."""
    E, K, U = 8, 8, 3
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)])
    a = ops.weight("onehot", T.F32, (E, 1, E), np.eye(E, dtype=np.float32).reshape(E, 1, E))
    b = ops.new_tensor(T.F32, (Tn, 1, K))
    ids = ops.new_tensor(T.I32, (Tn, U))
    probs = RNG.random((Tn, 1, K)).astype(np.float32)
    feeds = {b: probs, ids: iv.astype(np.int32)}
    (got,) = run([ops.mul_mat_id(a, b, ids)], feeds, CPU)
    np.testing.assert_array_equal(got[:, :, 0], np.take_along_axis(probs[:, 0], iv, axis=1))
    bad = iv.copy()
    bad[-1, -1] = E
    with pytest.raises(ComputeError, match=f"expert id {E} not in"):
        run([ops.mul_mat_id(a, b, ids)], {b: probs, ids: bad.astype(np.int32)}, CPU)
