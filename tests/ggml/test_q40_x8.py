"""Q4_0 (and Q4_1) weights repacked eight rows at a time (``q40_x8``): the layout round-trips bit for bit,
the 8-row kernel gives the result of the one-row kernel on the file's rows (``q40_r8_kernels``; bit for
bit: ``test_q40_r8``) and ``W @ (x quantized to 16 bits)`` in float64, bit for bit where every float
step is exact, non-finite activation rows give NaN rows, and ``mul_mat`` steps (8-row kernel, dequantized tiles)
on a memory-mapped weight agree with the plain path; weights it must not repack fall back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import q40_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.hsimd import quantize_rows_q16
from llamapy.ggml.cpu.q40_r8_kernels import mm_q4_0_r8, mm_q4_1_r8
from llamapy.ggml.cpu.q40_x8_kernels import mm_q4_0_x8, mm_q4_1_x8
from llamapy.ggml.cpu.q40_x8_rows import mm_q4_0_x8r4, mm_q4_0_x8r8, mm_q4_1_x8r4, mm_q4_1_x8r8
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.tensor import Tensor

F16 = mk.F16_TABLE
KERN = {T.Q4_0: (mm_q4_0_x8, mm_q4_0_r8), T.Q4_1: (mm_q4_1_x8, mm_q4_1_r8)}
ROWS = {T.Q4_0: (mm_q4_0_x8r4, mm_q4_0_x8r8), T.Q4_1: (mm_q4_1_x8r4, mm_q4_1_x8r8)}
BLOCK = {T.Q4_0: 18, T.Q4_1: 20}


def weights(t: T, rows: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.1, 3, (rows, 1)).astype(np.float32)
    return np.asarray(quantize(w, t)).reshape(rows, -1)


def random_bytes(t: T, rows: int, K: int, seed: int) -> np.ndarray:
    """Every bit random except the halves (finite): all nibble values in every position."""
    rng = np.random.default_rng(seed)
    nh = 2 if t == T.Q4_0 else 4
    raw = rng.integers(0, 256, (rows, K // 32, BLOCK[t]), dtype=np.uint8)
    raw[:, :, :nh] = rng.uniform(-2, 2, (rows, K // 32, nh // 2)).astype("<f2").view(np.uint8)
    return raw.reshape(rows, -1)


def q16(x: np.ndarray) -> np.ndarray:
    """x as the kernels see it: quantized to 16 bits per 32 elements, in float64."""
    M, K = x.shape
    xq = np.empty((M, K), np.int16)
    xd = np.empty((M, K // 32), np.float32)
    xs = np.empty((M, K // 32), np.float32)
    quantize_rows_q16(x, xq, xd, xs)
    return (xq.reshape(M, -1, 32).astype(np.float64) * xd[:, :, None]).reshape(M, K)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("K", [32, 96, 1536])
def test_repack_round_trips_bit_for_bit(t, K):
    raw = random_bytes(t, 24, K, K)
    R = q40_x8.repack(raw, t)
    assert R.shape == (3, raw.shape[1] * 8)  # the same bytes, moved
    back = np.zeros_like(raw)
    q40_x8.unpack_rows(R, 0, 24, back, t)
    np.testing.assert_array_equal(back, raw)
    part = np.zeros((7, raw.shape[1]), np.uint8)
    q40_x8.unpack_rows(R, 5, 12, part, t)  # rows across a group boundary
    np.testing.assert_array_equal(part, raw[5:12])


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize(("N", "K"), [(8, 32), (24, 96), (64, 1536), (40, 2816)])
def test_x8_kernel_matches_plain_kernel_and_float64(t, N, K):
    raw = random_bytes(t, N, K, N + K) if N == 24 else weights(t, N, K, N + K)
    x = np.random.default_rng(1).standard_normal((3, K)).astype(np.float32)
    x8, plain_kern = KERN[t]
    plain = np.zeros((3, N), np.float32)
    plain_kern(raw, x, plain, F16)
    out = np.zeros((3, N), np.float32)
    x8(q40_x8.repack(raw, t), x, out, 0)
    np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    ref = q16(x) @ dequantize(raw, t).astype(np.float64).T
    assert float(((out - ref) ** 2).sum() / (ref**2).sum()) < 1e-12


def q4_0_integer_case(rows: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Q4_0 rows with power-of-two scales, activations the 16-bit quantization keeps as integers (each
    block's largest is 32767: scale 1), their exact product): every float step of a kernel is exact, so
    its result must equal the product bit for bit."""
    rng = np.random.default_rng(9)
    raw = random_bytes(T.Q4_0, rows, K, 4).reshape(rows, K // 32, 18)
    d = (np.float16(2.0) ** rng.integers(-4, -2, (rows, K // 32, 1))).astype("<f2")
    raw[:, :, 0:2] = d.view(np.uint8)
    raw = raw.reshape(rows, -1)
    x = rng.integers(-5, 6, (2, K)).astype(np.float32)
    x[0, ::32] = 32767.0
    x[1, 5::32] = -32767.0
    expect = (x.astype(np.float64) @ dequantize(raw, T.Q4_0).astype(np.float64).T).astype(np.float32)
    return raw, x, expect


def test_x8_kernel_integer_sums_are_exact():
    """Every float step exact (``q4_0_integer_case``): the result is the integer dot product bit for bit
    (the nibble order, the -8 folded into the activation sums)."""
    raw, x, expect = q4_0_integer_case(16, 256)
    out = np.zeros((2, 16), np.float32)
    mm_q4_0_x8(q40_x8.repack(raw), x, out, 0)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 33])
def test_several_row_kernels_equal_one_row_kernel_bit_for_bit(t, M):
    """A row's result does not depend on how many rows a pass takes (prompt vs decode): four rows per
    pass, eight rows per pass (the rest four at a time, rows past M repeating the last)."""
    raw = random_bytes(t, 24, 1536, M)
    R = q40_x8.repack(raw, t)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    x[M // 2, 7] = np.nan
    one = np.zeros((M, 24), np.float32)
    KERN[t][0](R, x, one, 0)
    for kern in ROWS[t]:
        several = np.zeros((M, 24), np.float32)
        kern(R, x, several, 0)
        np.testing.assert_array_equal(several, one)
        assert np.isnan(several[M // 2]).all() and np.isfinite(np.delete(several, M // 2, 0)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_x8_kernel_nonfinite_activation_rows_give_nan(bad):
    raw = weights(T.Q4_0, 16, 512, 2)
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((3, 16), np.float32)
    mm_q4_0_x8(q40_x8.repack(raw), x, out, 0)
    assert np.isfinite(out[[0, 2]]).all()
    assert np.isnan(out[1]).all()


def mapped_weight(tmp_path: Path, t: T = T.Q4_0) -> tuple[np.ndarray, np.ndarray]:
    """(raw, mapped view of the same bytes) for a 48 x 1536 weight of type ``t`` in a file, at a page offset."""
    raw = weights(t, 48, 1536, 5)
    p = tmp_path / f"w-{t.name}.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return raw, mm[4096:].reshape(raw.shape)


@pytest.fixture
def mapped(tmp_path: Path):
    """(raw, mapped view of the same bytes) for a 48 x 1536 Q4_0 weight in a file, at a page offset."""
    return mapped_weight(tmp_path)


def weight_tensor(shape: tuple[int, int], t: T = T.Q4_0) -> Tensor:
    return ops.weight(
        "blk.0.ffn_up.weight", t, shape, np.zeros((shape[0], shape[1] // 32 * BLOCK[t]), np.uint8)
    )


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("M", [1, 5, 40, 300, 513])
def test_mul_mat_step_on_a_mapped_weight_matches_the_plain_path(tmp_path, t, M):
    raw, view = mapped_weight(tmp_path, t)
    a = weight_tensor((48, 1536), t)
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), -1.0, np.float32)
    step = q40_x8.mul_mat_step(be, a, view, x, out, None)
    assert step is not None
    step()
    if M <= q40_x8.MAX_ROWS:  # the 8-row kernels: the plain kernel's integer sums
        plain = np.zeros((M, 48), np.float32)
        KERN[t][1](raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    else:  # dequantized tiles (unpacked from the repacked rows) + sgemm
        ref = x.astype(np.float64) @ dequantize(raw, t).astype(np.float64).T
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert q40_x8.mul_mat_step(be, a, view, x, out, None) is not None  # cached: no second repack
    assert q40_x8._cache[a][1] is q40_x8._repacked(a, view, False)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
@pytest.mark.parametrize("M", [257, 300, q40_x8.MAX_ROWS])
def test_chunks_of_rows_give_the_bits_of_one_call(tmp_path, t, M):
    """Past ``CHUNK_ROWS`` the step calls the kernel once per chunk of rows: the same bits as one call on
    all of them (a row's result does not depend on the other rows of a call)."""
    assert q40_x8.CHUNK_ROWS < M <= q40_x8.MAX_ROWS
    raw, view = mapped_weight(tmp_path, t)
    a = weight_tensor((48, 1536), t)
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), np.nan, np.float32)
    q40_x8.mul_mat_step(be, a, view, x, out, None)()
    whole = np.full((M, 48), np.nan, np.float32)
    q40_x8.rows_kernel(t, M)(q40_x8._cache[a][1], x, whole, 0)
    assert np.array_equal(out.view(np.uint32), whole.view(np.uint32))


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
def test_rows_kernel_takes_eight_rows_per_pass_from_r8_min_rows(monkeypatch, t):
    monkeypatch.setattr(q40_x8, "R8_MIN_ROWS", None)
    assert q40_x8.rows_kernel(t, 4) is ROWS[t][0] and q40_x8.rows_kernel(t, 64) is ROWS[t][0]
    monkeypatch.setattr(q40_x8, "R8_MIN_ROWS", 8)
    assert q40_x8.rows_kernel(t, 7) is ROWS[t][0] and q40_x8.rows_kernel(t, 8) is ROWS[t][1]


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1])
def test_the_step_runs_the_kernel_for_its_row_count(tmp_path, t):
    """1-3 rows: the one-row kernel; ``MIN_ROWS_R4`` up to ``MAX_ROWS``: the several-rows kernel
    (``q40_x8.rows_kernel``); more: dequantized tiles (the unpack kernel)."""
    from llamapy.ggml.cpu.q40_x8_kernels import unpack_x8_rows

    _, view = mapped_weight(tmp_path, t)
    a = weight_tensor((48, 1536), t)
    for M, want in [
        (1, KERN[t][0]),
        (3, KERN[t][0]),
        (4, q40_x8.rows_kernel(t, 4)),
        (64, q40_x8.rows_kernel(t, 64)),
    ]:
        assert want in (KERN[t][0], *ROWS[t])
        be = CPUBackend(n_threads=1)
        x = np.ones((M, 1536), np.float32)
        assert q40_x8.mul_mat_step(be, a, view, x, np.zeros((M, 48), np.float32), None) is not None
        assert be._needed[-1] is want
    be = CPUBackend(n_threads=1)
    M = q40_x8.MAX_ROWS + 1
    x = np.ones((M, 1536), np.float32)
    assert q40_x8.mul_mat_step(be, a, view, x, np.zeros((M, 48), np.float32), None) is not None
    assert unpack_x8_rows in be._needed


def test_weights_it_must_not_repack_fall_back(mapped, monkeypatch):
    raw, view = mapped
    be = CPUBackend(n_threads=1)
    x = np.ones((1, 1536), np.float32)
    out = np.zeros((1, 48), np.float32)
    a = weight_tensor((48, 1536))
    assert q40_x8.mul_mat_step(be, a, raw, x, out, None) is None  # in memory, not a mapped file
    assert q40_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True) is not None
    odd = weight_tensor((44, 1536))
    assert q40_x8.mul_mat_step(be, odd, view[:44], x, out[:, :44], None) is None  # 44 % 8
    view_t = Tensor(T.Q4_0, (48, 1536), "view", name="a view")
    assert q40_x8.mul_mat_step(be, view_t, raw, x, out, None, any_memory=True) is None  # not a leaf
    q50 = ops.weight("w50", T.Q5_0, (48, 1536), np.zeros((48, 1536 // 32 * 22), np.uint8))
    assert q40_x8.mul_mat_step(be, q50, view, x, out, None, any_memory=True) is None  # not in TYPES
    monkeypatch.setattr(q40_x8, "ENABLED", False)
    assert q40_x8.mul_mat_step(be, weight_tensor((48, 1536)), view, x, out, None) is None


def test_tied_q4_0_model_decodes_as_without_repacking(tmp_path, monkeypatch):
    """A small llama file quantized to pure Q4_0 (the output tied to ``token_embd``: ``get_rows`` reads the
    mapped bytes, ``mul_mat`` the repacked copy), prompt as one batch (the four-row kernel) and token by
    token: against the NumPy backend (float activations), the repacked path's largest logit error is no
    larger than the plain kernels' (measured: 3.7e-4 vs 4.1e-4 of the largest logit; the two differ from
    each other by 2.1e-4 on this random model, which amplifies float rounding)."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.gguf.reader import GGUFReader
    from llamapy.model import Model
    from llamapy.quantize import quantize_file
    from tests.quantize.models import write_model

    src = write_model("tied8", tmp_path / "tied8.gguf")
    path = tmp_path / "tied8-q40.gguf"
    quantize_file(src, path, "Q4_0", pure=True)
    with GGUFReader(path) as r:
        types = {t.name: t.ggml_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q4_0" and "output.weight" not in types
    toks = [1, 17, 42, 99, 200, 3]

    def logits(enabled: bool, backend: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(prompt as one batch: last logits, token by token: each token's logits)"""
        monkeypatch.setattr(q40_x8, "ENABLED", enabled)
        model = Model.load(path)
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2, backend=backend))
        ctx.decode(Batch.from_tokens(toks, pos0=0))
        batch = ctx.get_logits()[-1].copy()
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2, backend=backend))
        rows = []
        for i, t in enumerate(toks):
            ctx.decode(Batch.from_tokens([t], pos0=i))
            rows.append(ctx.get_logits()[-1].copy())
        if backend is None:
            assert bool([t for t in q40_x8._cache.keys() if t.name == "token_embd.weight"]) is enabled
        return batch, np.array(rows)

    rb, r1 = logits(False, "numpy")  # float activations, dequantized weights: the reference
    pb, p1 = logits(False)
    xb, x1 = logits(True)
    assert np.isfinite(xb).all() and np.isfinite(x1).all()
    scale = np.abs(r1).max()
    err_plain = max(np.abs(p1 - r1).max(), np.abs(pb - rb).max())
    err_x8 = max(np.abs(x1 - r1).max(), np.abs(xb - rb).max())
    assert err_plain < 0.01 * scale
    assert err_x8 <= 1.5 * err_plain + 1e-5 * scale
