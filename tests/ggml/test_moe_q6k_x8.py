"""Q6_K experts repacked eight rows at a time (``moe_x8`` with ``moe_q6k_x8_kernels``): the fused experts
kernel equals the dense Q6_K 8-row kernel per expert bit for bit, the plain fused kernel up to float
summation order and ``W @ dequant(quant(x, Q8_K))`` in float64; through the graph on a memory-mapped weight
it agrees with the plain path and the NumPy reference, every expert repacked when the step is made."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.cpu import moe_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.matmul_kernels import F16_TABLE
from llamapy.ggml.cpu.moe_kernels import MOE
from llamapy.ggml.quants import dequantize, quantize
from tests.ggml.test_moe_x8 import dense_per_pair

q6k = pytest.importorskip("llamapy.ggml.cpu.q6k_x8_kernels")  # the Q6_K 8-row layout
X8_BYTES, mm_q6_k_x8, repack_x8 = q6k.X8_BYTES, q6k.mm_q6_k_x8, q6k.repack_x8
moe_q6_k_x8 = pytest.importorskip("llamapy.ggml.cpu.moe_q6k_x8_kernels").moe_q6_k_x8

RNG = np.random.default_rng(26)
CPU = CPUBackend(2)
Q8_NMSE = 5e-4


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def q6k_experts(E: int, N: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((E * N, K)).astype(np.float32) * rng.uniform(0.1, 3, (E * N, 1)).astype(
        np.float32
    )
    return np.asarray(quantize(w, T.Q6_K)).reshape(E, N, -1)


def repack(raw: np.ndarray) -> np.ndarray:
    E, N, rb = raw.shape
    R = np.zeros((E, N // 8, rb // 210 * X8_BYTES), np.uint8)
    for e in range(E):
        repack_x8(raw[e], R[e])
    return R


@pytest.mark.parametrize(("shared", "chunks"), [(True, 1), (True, 2), (False, 2), (False, 5)])
def test_kernel_equals_dense_x8_per_expert_plain_moe_and_float64(shared, chunks):
    E, N, K, U, Tn = 5, 24, 512, 3, 4
    raw = q6k_experts(E, N, K, 2)
    R = repack(raw)
    x = RNG.standard_normal((Tn, 1 if shared else U, K)).astype(np.float32)
    x[2, 0, 100] = np.nan  # a non-finite activation row: NaN outputs for its pairs only
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)]).astype(np.int32)
    iv[0] = [4, 0, 2]
    out = np.full((Tn * U, N), -1.0, np.float32)
    assert moe_q6_k_x8(R, x, iv, out, 256, chunks, 0) == -1
    plain = np.full((Tn * U, N), -1.0, np.float32)
    assert MOE["Q6_K"](raw, x, iv, plain, F16_TABLE, 256) == -1
    for t in range(Tn):
        for u in range(U):
            p, e = t * U + u, iv[t, u]
            xr = np.ascontiguousarray(x[t, 0 if shared else u][None])
            y = np.empty((1, N), np.float32)
            mm_q6_k_x8(R[e], xr, y, 0)
            np.testing.assert_array_equal(out[p], y[0])
            if t == 2 and (shared or u == 0):
                assert np.isnan(out[p]).all() and np.isnan(plain[p]).all()
                continue
            np.testing.assert_allclose(out[p], plain[p], rtol=2e-6, atol=2e-6 * np.abs(plain[p]).max())
            xd = dequantize(quantize(xr, T.Q8_K), T.Q8_K).astype(np.float64)
            ref = (xd @ dequantize(raw[e], T.Q6_K).astype(np.float64).T)[0]
            assert nmse(out[p], ref) < 1e-11


def test_pairs_grouped_give_the_dense_kernels_bits():
    """Experts with 9, 5, 7, 6 pairs (4 + 4 + 1, 4 + 1, 4 + 3, 4 + 2): each pair equals the dense kernel."""
    E, N, K, U, Tn = 4, 16, 512, 3, 9
    raw = q6k_experts(E, N, K, 4)
    R = repack(raw)
    x = RNG.standard_normal((Tn, U, K)).astype(np.float32)
    iv = np.zeros((Tn, U), np.int32)
    iv[:, 1] = 1 + (np.arange(Tn) % 3 == 0)
    iv[:, 2] = [3, 2, 2, 3, 2, 3, 3, 3, 3]
    iv[-1] = [0, 2, 3]
    assert list(np.bincount(iv.ravel())) == [9, 5, 7, 6]
    out = np.full((Tn * U, N), -1.0, np.float32)
    assert moe_q6_k_x8(R, x, iv, out, 256, 2, 0) == -1
    for t in range(Tn):
        for u in range(U):
            y = np.empty((1, N), np.float32)
            mm_q6_k_x8(R[iv[t, u]], np.ascontiguousarray(x[t, u][None]), y, 0)
            np.testing.assert_array_equal(out[t * U + u], y[0])


def test_kernel_bad_id_and_expert_limit():
    E, N, K = 3, 8, 256
    R = repack(q6k_experts(E, N, K, 3))
    x = RNG.standard_normal((3, 1, K)).astype(np.float32)
    out = np.full((6, N), -1.0, np.float32)
    for bad in (-1, 3):
        iv = np.array([[0, 1], [2, bad], [bad, 0]], np.int32)
        assert moe_q6_k_x8(R, x, iv, out, 256, 2, 0) == 3
        assert (out == -1.0).all()
    iv = np.array([[0, 1], [0, 2], [0, 1]], np.int32)  # expert 0: 3 pairs > 2, left to the caller
    assert moe_q6_k_x8(R, x, iv, out, 2, 2, 0) == -1
    assert (out[[0, 2, 4]] == -1.0).all() and (out[[1, 3, 5]] != -1.0).all()


def run(outs, feeds, be):
    s = Scheduler([be])
    s.compute(Graph(outs), feeds)
    return [np.array(s.get(o)) for o in outs]


def graph(data: np.ndarray, K: int, iv: np.ndarray):
    E, N = data.shape[:2]
    Tn, U = iv.shape
    rng = np.random.default_rng(0)
    a = ops.weight("blk.0.ffn_down_exps.weight", T.Q6_K, (E, N, K), data)
    b = ops.new_tensor(T.F32, (Tn, U, K))
    ids = ops.new_tensor(T.I32, (Tn, U))
    feeds = {b: rng.standard_normal((Tn, U, K)).astype(np.float32), ids: iv.astype(np.int32)}
    return a, [ops.mul_mat_id(a, b, ids)], feeds


@pytest.mark.parametrize("Tn", [1, 6])
def test_graph_on_mapped_experts_matches_plain_and_reference(tmp_path: Path, monkeypatch, Tn):
    E, N, K, U = 7, 16, 512, 3
    raw = q6k_experts(E, N, K, 11)
    p = tmp_path / "w.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    view = np.memmap(p, mode="r", dtype=np.uint8)[4096:].reshape(raw.shape)
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)])
    monkeypatch.setattr(moe_x8, "ENABLED_Q6K", True)
    a, outs, feeds = graph(view, K, iv)
    x8 = run(outs, feeds, CPU)
    _, R = moe_x8._cache[a]
    np.testing.assert_array_equal(R, repack(raw))  # every expert, chosen or not
    monkeypatch.setattr(moe_x8, "ENABLED_Q6K", False)
    plain = run(*graph(raw, K, iv)[1:], CPU)
    ref = run(*graph(raw, K, iv)[1:], NumpyBackend())
    assert nmse(x8[0], plain[0]) <= 1e-10
    assert nmse(x8[0], ref[0]) <= Q8_NMSE
    bad = iv.copy()
    bad[0, 1] = E
    monkeypatch.setattr(moe_x8, "ENABLED_Q6K", True)
    _, outs, feeds = graph(view, K, bad)
    with pytest.raises(ComputeError, match=f"expert id {E} not in 0..{E - 1}"):
        run(outs, feeds, CPU)


def test_more_pairs_than_the_kernel_takes_run_unpacked_tiles(tmp_path: Path, monkeypatch):
    from llamapy.ggml.cpu import backend
    from llamapy.ggml.cpu.backend import matvec_max_rows

    E, N, K, U = 3, 24, 256, 2
    Tn = matvec_max_rows("Q6_K") + 20
    iv = np.zeros((Tn, U), np.int64)
    iv[:, 1] = RNG.integers(1, E, Tn)  # expert 0: every token (tiles); 1 and 2: the kernel
    monkeypatch.setattr(backend, "TILE_FLOATS", 16 * K)  # tiles of 16 rows: 24 = 16 + 8
    raw = q6k_experts(E, N, K, 12)
    p = tmp_path / "w.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    view = np.memmap(p, mode="r", dtype=np.uint8)[4096:].reshape(raw.shape)
    monkeypatch.setattr(moe_x8, "ENABLED_Q6K", True)
    x8 = run(*graph(view, K, iv)[1:], CPU)
    monkeypatch.setattr(moe_x8, "ENABLED_Q6K", False)
    plain = run(*graph(raw, K, iv)[1:], CPU)
    ref = run(*graph(raw, K, iv)[1:], NumpyBackend())
    assert nmse(x8[0], plain[0]) <= 1e-10
    assert nmse(x8[0], ref[0]) <= Q8_NMSE


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(("E", "U", "Tn"), [(9, 4, 1), (9, 3, 1), (12, 2, 3)])
@pytest.mark.parametrize("chunks", [1, 2, 3, 64])
def test_one_pair_each_two_streams_equal_dense(shared, E, U, Tn, chunks):
    """Every chosen expert with one pair (decode): the two-stream loop (``moe_x8_kernels.moe_x8_rows``)
    equals the dense Q6_K 8-row kernel per pair bit for bit, for any work split and an even or odd item
    count, and the four-pair loop where the same pairs are also chosen by a second token; a non-finite
    activation row gives NaN for its pairs only."""
    N, K = 40, 512
    raw = q6k_experts(E, N, K, 7)
    R = repack(raw)
    x = RNG.standard_normal((Tn, 1 if shared else U, K)).astype(np.float32)
    iv = RNG.permutation(E)[: Tn * U].reshape(Tn, U).astype(np.int32)
    if Tn > 1:
        x[1, 0, 5] = np.inf
    out = np.full((Tn * U, N), -1.0, np.float32)
    assert moe_q6_k_x8(R, x, iv, out, 256, chunks, 0) == -1
    dense = dense_per_pair(mm_q6_k_x8, R, x, iv)
    np.testing.assert_array_equal(out, dense)
    for t in range(Tn):
        for u in range(U):
            assert np.isnan(dense[t * U + u]).all() == (t == 1 and (shared or u == 0))
    neg = np.full((Tn * U, N), -3.0, np.float32)
    assert moe_q6_k_x8(R, x, iv, neg, 256, -chunks, 0) == -1  # one item after the other (``prefetch_tune``)
    np.testing.assert_array_equal(neg, out)
    # the same token twice: each expert has two pairs (the four-pair loop), the same bits per pair
    x2 = np.concatenate([x[:1], x[:1]])
    twice = np.full((2 * U, N), -1.0, np.float32)
    assert moe_q6_k_x8(R, x2, np.concatenate([iv[:1], iv[:1]]), twice, 256, chunks, 0) == -1
    np.testing.assert_array_equal(twice[:U], out[:U])
    np.testing.assert_array_equal(twice[U:], out[:U])
