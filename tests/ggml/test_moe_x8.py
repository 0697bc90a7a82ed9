"""Q4_K experts repacked eight rows at a time (``moe_x8``, ``moe_x8_kernels``): the fused 8-row experts
kernel equals the dense 8-row kernel per expert bit for bit, the plain fused kernel (``moe_kernels``) up to
float summation order and ``W @ dequant(quant(x, Q8_K))`` in float64; through the graph on a memory-mapped
weight it agrees with the plain path and the NumPy reference, including experts with more pairs than the
kernel takes (tiles unpacked from the repacked rows), bad expert ids (a ComputeError, nothing computed),
odd expert counts, unchosen experts; weights it must not repack fall back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import Graph, NumpyBackend, Scheduler, ops
from llamapy.ggml.backend import ComputeError
from llamapy.ggml.cpu import backend, moe_x8, q4k_x8
from llamapy.ggml.cpu.backend import CPUBackend, matvec_max_rows
from llamapy.ggml.cpu.matmul_kernels import F16_TABLE
from llamapy.ggml.cpu.moe_kernels import MOE
from llamapy.ggml.cpu.moe_x8_kernels import moe_q4_k_x8, moe_q4_k_x8_1
from llamapy.ggml.cpu.q4k_x8_kernels import mm_q4_k_x8, unpack_x8_rows
from llamapy.ggml.quants import dequantize, quantize

RNG = np.random.default_rng(25)
CPU = CPUBackend(2)
#: llama.cpp's test-backend-ops bound for kernels that quantize the activations
Q8_NMSE = 5e-4


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


def q4k_experts(E: int, N: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((E * N, K)).astype(np.float32) * rng.uniform(0.1, 3, (E * N, 1)).astype(
        np.float32
    )
    return np.asarray(quantize(w, T.Q4_K)).reshape(E, N, -1)


def dense_per_pair(kern: Callable[..., object], R: np.ndarray, x: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """The dense one-row 8-row kernel ``kern`` on each pair's expert and activation row: row ``t * U + u``
    (``x`` ``[T, 1 or U, K]``)."""
    Tn, U = iv.shape
    out = np.empty((Tn * U, R.shape[1] * 8), np.float32)
    for t in range(Tn):
        for u in range(U):
            p = t * U + u
            kern(
                R[iv[t, u]], np.ascontiguousarray(x[t, 0 if x.shape[1] == 1 else u][None]), out[p : p + 1], 0
            )
    return out


def ref64(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    xd = dequantize(quantize(x, T.Q8_K), T.Q8_K).astype(np.float64)
    return xd @ dequantize(raw, T.Q4_K).astype(np.float64).T


def test_repack_of_experts_round_trips_per_expert():
    raw = q4k_experts(3, 16, 512, 1)
    R = q4k_x8.repack(raw)
    assert R.shape == (3, 2, 2 * 1184)
    for e in range(3):
        back = np.zeros_like(raw[e])
        unpack_x8_rows(R[e], 0, 16, back)
        np.testing.assert_array_equal(back, raw[e])
        np.testing.assert_array_equal(R[e], q4k_x8.repack(raw[e]))  # the 2-D layout, per expert


@pytest.mark.parametrize(("shared", "chunks"), [(True, 1), (True, 2), (False, 2), (False, 5)])
def test_kernel_equals_dense_x8_per_expert_plain_moe_and_float64(shared, chunks):
    """``chunks``: the work split (the thread count; 5 > the 3 row groups: clamped)."""
    E, N, K, U, Tn = 5, 24, 768, 3, 4  # odd E; with 4 x 3 pairs some experts get none, some several
    raw = q4k_experts(E, N, K, 2)
    R = q4k_x8.repack(raw)
    x = RNG.standard_normal((Tn, 1 if shared else U, K)).astype(np.float32)
    x[2, 0, 100] = np.nan  # a non-finite activation row: NaN outputs for its pairs only
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)]).astype(np.int32)
    iv[0] = [4, 0, 2]
    out = np.full((Tn * U, N), -1.0, np.float32)
    assert moe_q4_k_x8(R, x, iv, out, 256, chunks, 0) == -1
    plain = np.full((Tn * U, N), -1.0, np.float32)
    assert MOE["Q4_K"](raw, x, iv, plain, F16_TABLE, 256) == -1
    for t in range(Tn):
        for u in range(U):
            p, e = t * U + u, iv[t, u]
            xr = np.ascontiguousarray(x[t, 0 if shared else u][None])
            y = np.empty((1, N), np.float32)
            mm_q4_k_x8(R[e], xr, y, 0)
            np.testing.assert_array_equal(out[p], y[0])
            if t == 2 and (shared or u == 0):
                assert np.isnan(out[p]).all() and np.isnan(plain[p]).all()
                continue
            np.testing.assert_allclose(out[p], plain[p], rtol=2e-6, atol=2e-6 * np.abs(plain[p]).max())
            ref = ref64(raw[e], xr)[0]
            assert nmse(out[p], ref) < 1e-11


@pytest.mark.parametrize("shared", [True, False])
def test_pairs_grouped_four_two_one_give_the_same_bits(shared):
    """Experts with 1..9 pairs (4 + 4 + 1, 4 + 2 + 1, 2 + 1, ...): the grouped kernel equals one pair at
    a time and the dense 8-row kernel per pair, bit for bit."""
    E, N, K, U, Tn = 4, 16, 512, 3, 9
    raw = q4k_experts(E, N, K, 4)
    R = q4k_x8.repack(raw)
    x = RNG.standard_normal((Tn, 1 if shared else U, K)).astype(np.float32)
    iv = np.zeros((Tn, U), np.int32)
    iv[:, 1] = 1 + (np.arange(Tn) % 3 == 0)
    iv[:, 2] = [3, 2, 2, 3, 2, 3, 3, 3, 3]
    iv[-1] = [0, 2, 3]  # pairs: expert 0 9 (4 + 4 + 1), 1 5 (4 + 1), 2 7 (4 + 2 + 1), 3 6 (4 + 2)
    assert list(np.bincount(iv.ravel())) == [9, 5, 7, 6]
    grouped = np.full((Tn * U, N), -1.0, np.float32)
    single = np.full((Tn * U, N), -2.0, np.float32)
    assert moe_q4_k_x8(R, x, iv, grouped, 256, 2, 0) == -1
    assert moe_q4_k_x8_1(R, x, iv, single, 256, 2, 0) == -1
    np.testing.assert_array_equal(grouped, single)
    np.testing.assert_array_equal(grouped, dense_per_pair(mm_q4_k_x8, R, x, iv))


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(("E", "U", "Tn"), [(9, 4, 1), (9, 3, 1), (7, 1, 1), (12, 2, 3)])
@pytest.mark.parametrize("chunks", [1, 2, 3, 7, 64])
def test_one_pair_each_two_streams_equal_dense_and_one_item_at_a_time(shared, E, U, Tn, chunks):
    """Every chosen expert with one pair (decode; ``Tn`` 3: three tokens on distinct experts): the
    two-stream loop (``moe_x8_rows``) equals the dense 8-row kernel per pair and the one-item-at-a-time
    loop bit for bit, for any work split (1, 2, 3, 7 and 64 > the 5 row groups) and an even or odd item
    count; a non-finite activation row gives NaN for its pairs only."""
    N, K = 40, 512
    raw = q4k_experts(E, N, K, 7)
    R = q4k_x8.repack(raw)
    x = RNG.standard_normal((Tn, 1 if shared else U, K)).astype(np.float32)
    iv = RNG.permutation(E)[: Tn * U].reshape(Tn, U).astype(np.int32)
    if Tn > 1:
        x[1, 0, 5] = np.inf
    two = np.full((Tn * U, N), -1.0, np.float32)
    one = np.full((Tn * U, N), -2.0, np.float32)
    assert moe_q4_k_x8(R, x, iv, two, 256, chunks, 0) == -1
    assert moe_q4_k_x8_1(R, x, iv, one, 256, chunks, 2048) == -1
    np.testing.assert_array_equal(two, one)
    neg = np.full((Tn * U, N), -3.0, np.float32)
    assert moe_q4_k_x8(R, x, iv, neg, 256, -chunks, 0) == -1  # one stream a thread (``prefetch_tune``)
    np.testing.assert_array_equal(neg, two)
    dense = dense_per_pair(mm_q4_k_x8, R, x, iv)
    np.testing.assert_array_equal(two, dense)
    for t in range(Tn):
        for u in range(U):
            assert np.isnan(dense[t * U + u]).all() == (t == 1 and (shared or u == 0))


def test_kernel_bad_id_and_expert_limit():
    E, N, K, U = 3, 8, 256, 2
    raw = q4k_experts(E, N, K, 3)
    R = q4k_x8.repack(raw)
    x = RNG.standard_normal((3, 1, K)).astype(np.float32)
    out = np.full((6, N), -1.0, np.float32)
    for bad in (-1, 3, 1 << 20):
        iv = np.array([[0, 1], [2, bad], [bad, 0]], np.int32)
        assert moe_q4_k_x8(R, x, iv, out, 256, 2, 0) == 3  # the first bad pair
        assert (out == -1.0).all()  # nothing written
    iv = np.array([[0, 1], [0, 2], [0, 1]], np.int32)  # expert 0: 3 pairs > 2, left to the caller
    assert moe_q4_k_x8(R, x, iv, out, 2, 2, 0) == -1
    assert (out[[0, 2, 4]] == -1.0).all() and (out[[1, 3, 5]] != -1.0).all()
    assert moe_q4_k_x8(R, x[:0], np.zeros((0, U), np.int32), out[:0], 256, 2, 0) == -1  # no tokens


# -- through the graph, on a memory-mapped weight ----------------------------------------------------
def mapped_experts(
    tmp_path: Path, E: int, N: int, K: int, name: str = "w.bin"
) -> tuple[np.ndarray, np.ndarray]:
    raw = q4k_experts(E, N, K, E * N + K)
    p = tmp_path / name
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    return raw, np.memmap(p, mode="r", dtype=np.uint8)[4096:].reshape(raw.shape)


def run(outs, feeds, be):
    s = Scheduler([be])
    s.compute(Graph(outs), feeds)
    return [np.array(s.get(o)) for o in outs]


def graph(data: np.ndarray, K: int, iv: np.ndarray, seed: int = 0):
    E, N = data.shape[:2]
    Tn, U = iv.shape
    rng = np.random.default_rng(seed)
    a = ops.weight("blk.0.ffn_up_exps.weight", T.Q4_K, (E, N, K), data)
    b = ops.new_tensor(T.F32, (Tn, 1, K))
    b2 = ops.new_tensor(T.F32, (Tn, U, K))
    ids = ops.new_tensor(T.I32, (Tn, U))
    feeds = {
        b: rng.standard_normal((Tn, 1, K)).astype(np.float32),
        b2: rng.standard_normal((Tn, U, K)).astype(np.float32),
        ids: iv.astype(np.int32),
    }
    return a, [ops.mul_mat_id(a, b, ids), ops.mul_mat_id(a, b2, ids)], feeds


def both(tmp_path, monkeypatch, E, N, K, iv, repacked=True):
    """(x8 outputs, plain outputs, NumPy reference outputs) of one graph on a mapped weight."""
    raw, view = mapped_experts(tmp_path, E, N, K)
    a, outs, feeds = graph(view, K, iv)
    calls = []
    real = moe_x8.mul_mat_id_step

    def spy(*args, **kw):
        s = real(*args, **kw)
        calls.append(s is not None)
        return s

    monkeypatch.setattr(moe_x8, "mul_mat_id_step", spy)
    monkeypatch.setattr(moe_x8, "ENABLED", True)  # on by default (LLAMAPY_MOE_X8=0: off)
    x8 = run(outs, feeds, CPU)
    assert calls and all(c == repacked for c in calls)
    assert (a in moe_x8._cache) == repacked
    if repacked:  # every expert repacked when the step was made, chosen or not
        _, R = moe_x8._cache[a]
        np.testing.assert_array_equal(R, q4k_x8.repack(raw))
    monkeypatch.setattr(moe_x8, "ENABLED", False)
    plain = run(*graph(raw, K, iv)[1:], CPU)  # same seed: the same activations
    ref = run(*graph(raw, K, iv)[1:], NumpyBackend())
    return x8, plain, ref


@pytest.mark.parametrize("Tn", [1, 6])
def test_graph_on_mapped_experts_matches_plain_and_reference(tmp_path, monkeypatch, Tn):
    E, N, K, U = 7, 16, 512, 3  # most of the 7 experts unchosen for one token
    iv = np.stack([RNG.choice(E, U, replace=False) for _ in range(Tn)])
    x8, plain, ref = both(tmp_path, monkeypatch, E, N, K, iv)
    for f, p, r in zip(x8, plain, ref, strict=True):
        assert nmse(f, p) <= 1e-10
        assert nmse(f, r) <= Q8_NMSE


def test_more_pairs_than_the_kernel_takes_run_unpacked_tiles(tmp_path, monkeypatch):
    E, N, K, U = 3, 24, 256, 2
    Tn = matvec_max_rows("Q4_K") + 20
    iv = np.zeros((Tn, U), np.int64)
    iv[:, 1] = RNG.integers(1, E, Tn)  # expert 0: every token (tiles); 1 and 2: ~138 each (kernel)
    monkeypatch.setattr(backend, "TILE_FLOATS", 16 * K)  # tiles of 16 rows: 24 = 16 + 8
    x8, plain, ref = both(tmp_path, monkeypatch, E, N, K, iv)
    for f, p, r in zip(x8, plain, ref, strict=True):
        assert nmse(f, p) <= 1e-10
        assert nmse(f, r) <= Q8_NMSE


@pytest.mark.parametrize("bad", [-1, 5])
def test_bad_expert_id_is_a_compute_error(tmp_path, bad):
    raw, view = mapped_experts(tmp_path, 5, 8, 256)
    _, outs, feeds = graph(view, 256, np.array([[0, 1], [2, bad]]))
    with pytest.raises(ComputeError, match=f"expert id {bad} not in 0..4"):
        run(outs, feeds, CPU)


def test_experts_it_must_not_repack_fall_back(tmp_path, monkeypatch):
    iv = np.array([[0, 2], [1, 2]])
    for E, N in [(3, 12)]:  # rows not a multiple of 8
        x8, plain, ref = both(tmp_path, monkeypatch, E, N, 256, iv, repacked=False)
        for f, p in zip(x8, plain, strict=True):
            np.testing.assert_array_equal(f, p)
    monkeypatch.setattr(moe_x8, "ENABLED", True)
    raw = q4k_experts(3, 8, 256, 9)  # in memory, not a mapped file
    a = ops.weight("e", T.Q4_K, (3, 8, 256), raw)
    out = np.zeros((2, 2, 8), np.float32)
    x = np.zeros((2, 1, 256), np.float32)
    assert moe_x8.mul_mat_id_step(CPU, a, raw, x, iv, out, ValueError) is None
    assert moe_x8.mul_mat_id_step(CPU, a, raw, x, iv, out, ValueError, any_memory=True) is not None
    monkeypatch.setattr(moe_x8, "ENABLED", False)  # LLAMAPY_MOE_X8=0
    assert moe_x8.mul_mat_id_step(CPU, a, raw, x, iv, out, ValueError, any_memory=True) is None
