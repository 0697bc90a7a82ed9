"""Q5_0 (and Q5_1) weights repacked eight rows at a time (``q50_x8``): the layout round-trips bit for bit,
the 8-row kernel gives the plain 16-bit-activation kernel's result (``q16_kernels``) up to float
summation order, bit for bit where every float step is exact, non-finite activation rows give NaN rows,
``mul_mat`` steps on a memory-mapped weight agree with the plain path, and a Q5_0 model decodes as
without repacking."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import q16_kernels as qk
from llamapy.ggml.cpu import q50_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.hsimd import quantize_rows_q16
from llamapy.ggml.cpu.q50_x8_kernels import mm_q5_0_x8, mm_q5_0_x8r4, mm_q5_1_x8, unpack_x8_rows
from llamapy.ggml.cpu.repack import LAYOUTS
from llamapy.ggml.quants import dequantize, quantize

F16 = mk.F16_TABLE
KERN = {T.Q5_0: (mm_q5_0_x8, qk.mm16_q5_0), T.Q5_1: (mm_q5_1_x8, qk.mm16_q5_1)}
BLOCK = {T.Q5_0: 22, T.Q5_1: 24}
HALVES = {T.Q5_0: 2, T.Q5_1: 4}


def weights(t: T, rows: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.1, 3, (rows, 1)).astype(np.float32)
    return np.asarray(quantize(w, t)).reshape(rows, -1)


def random_bytes(t: T, rows: int, K: int, seed: int) -> np.ndarray:
    """Every bit random except the halves (finite): all five-bit values in every position."""
    rng = np.random.default_rng(seed)
    nh = HALVES[t]
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


@pytest.mark.parametrize("t", [T.Q5_0, T.Q5_1])
@pytest.mark.parametrize("K", [32, 96, 896])
def test_repack_round_trips_bit_for_bit(t, K):
    raw = random_bytes(t, 24, K, K)
    R = q50_x8.repack(raw, t)
    assert R.shape == (3, raw.shape[1] * 8)  # the same bytes, moved
    back = np.zeros_like(raw)
    q50_x8.unpack_rows(R, 0, 24, back, t)
    np.testing.assert_array_equal(back, raw)
    part = np.zeros((7, raw.shape[1]), np.uint8)
    q50_x8.unpack_rows(R, 5, 12, part, t)  # rows across a group boundary
    np.testing.assert_array_equal(part, raw[5:12])


def test_repacked_fifth_bits_sit_where_the_kernel_reads_them():
    """Weight ``k`` of row r in a block: its fifth bit is bit ``2c + (e & 1) + 8 (e >> 1)`` of qh word ``2r +
    j`` (``k = 16(e & 1) + 4c + (e >> 1) + 2j``), its nibble in chunk c's 4 bytes of row r."""
    raw = np.zeros((8, 22), np.uint8)
    r, k = 5, 16 + 4 * 2 + 1 + 2 * 1  # c = 2, e = 3, j = 1
    raw[r, 2:6] = np.frombuffer(np.uint32(1 << k).tobytes(), np.uint8)
    R = q50_x8.repack(raw)
    words = R[0, 16:48].view("<u2")
    assert words[2 * r + 1] == 1 << (2 * 2 + 1 + 8) and np.count_nonzero(words) == 1


@pytest.mark.parametrize("t", [T.Q5_0, T.Q5_1])
@pytest.mark.parametrize(("N", "K"), [(8, 32), (24, 96), (64, 896), (40, 2816)])
def test_x8_kernel_matches_plain_kernel_and_float64(t, N, K):
    raw = random_bytes(t, N, K, N + K) if N == 24 else weights(t, N, K, N + K)
    x = np.random.default_rng(1).standard_normal((3, K)).astype(np.float32)
    x8, plain_kern = KERN[t]
    plain = np.zeros((3, N), np.float32)
    plain_kern(raw, x, plain, F16)
    out = np.zeros((3, N), np.float32)
    x8(q50_x8.repack(raw, t), x, out, 0)
    np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    ref = q16(x) @ dequantize(raw, t).astype(np.float64).T
    assert float(((out - ref) ** 2).sum() / (ref**2).sum()) < 1e-12


@pytest.mark.parametrize("t", [T.Q5_0, T.Q5_1])
def test_x8_kernel_integer_sums_are_exact(t):
    """Scales powers of two and activations that 16-bit quantization keeps as integers (each block's
    largest is 32767: scale 1): every float step is exact, so the result must equal the integer dot
    product bit for bit (the nibble and fifth-bit order, the -16 folded into the activation sums)."""
    rng = np.random.default_rng(9)
    rows, K = 16, 256
    raw = random_bytes(t, rows, K, 4).reshape(rows, K // 32, BLOCK[t])
    d = (np.float16(2.0) ** rng.integers(-4, -2, (rows, K // 32, HALVES[t] // 2))).astype("<f2")
    raw[:, :, : HALVES[t]] = d.view(np.uint8)
    raw = raw.reshape(rows, -1)
    x = rng.integers(-5, 6, (2, K)).astype(np.float32)
    x[0, ::32] = 32767.0
    x[1, 5::32] = -32767.0
    expect = (x.astype(np.float64) @ dequantize(raw, t).astype(np.float64).T).astype(np.float32)
    out = np.zeros((2, rows), np.float32)
    KERN[t][0](q50_x8.repack(raw, t), x, out, 0)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 7, 8, 13])
def test_four_row_kernel_equals_one_row_kernel_bit_for_bit(M):
    """A row's result does not depend on how many rows a pass takes (prompt vs decode); rows past M
    repeat the last."""
    raw = random_bytes(T.Q5_0, 24, 896, M)
    R = q50_x8.repack(raw)
    x = np.random.default_rng(M).standard_normal((M, 896)).astype(np.float32)
    x[M // 2, 7] = np.nan
    one = np.zeros((M, 24), np.float32)
    mm_q5_0_x8(R, x, one, 0)
    several = np.zeros((M, 24), np.float32)
    mm_q5_0_x8r4(R, x, several, 0)
    np.testing.assert_array_equal(several, one)
    assert np.isnan(several[M // 2]).all() and np.isfinite(np.delete(several, M // 2, 0)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_x8_kernel_nonfinite_activation_rows_give_nan(bad):
    raw = weights(T.Q5_0, 16, 512, 2)
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((3, 16), np.float32)
    mm_q5_0_x8(q50_x8.repack(raw), x, out, 0)
    assert np.isfinite(out[[0, 2]]).all()
    assert np.isnan(out[1]).all()


def mapped_weight(tmp_path: Path, t: T = T.Q5_0) -> tuple[np.ndarray, np.ndarray]:
    """(raw, mapped view of the same bytes) for a 48 x 896 weight of type ``t`` in a file, at a page offset."""
    raw = weights(t, 48, 896, 5)
    p = tmp_path / f"w-{t.name}.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return raw, mm[4096:].reshape(raw.shape)


def weight_tensor(shape: tuple[int, int], t: T = T.Q5_0):
    return ops.weight(
        "blk.0.ffn_up.weight", t, shape, np.zeros((shape[0], shape[1] // 32 * BLOCK[t]), np.uint8)
    )


@pytest.mark.parametrize("M", [1, 3, 5, 64, 300])
def test_mul_mat_step_on_a_mapped_weight_matches_the_plain_path(tmp_path, M):
    raw, view = mapped_weight(tmp_path)
    a = weight_tensor((48, 896))
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 896)).astype(np.float32)
    out = np.full((M, 48), -1.0, np.float32)
    step = q50_x8.mul_mat_step(be, a, view, x, out, None)
    assert step is not None
    step()
    if M <= q50_x8.MAX_ROWS:  # the 8-row kernel: the plain kernel's integer sums
        assert be._needed[-1] is (mm_q5_0_x8 if M < q50_x8.MIN_ROWS_R4 else mm_q5_0_x8r4)
        plain = np.zeros((M, 48), np.float32)
        qk.mm16_q5_0(raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    else:  # dequantized tiles (unpacked from the repacked rows) + sgemm
        assert unpack_x8_rows in be._needed
        ref = x.astype(np.float64) @ dequantize(raw, T.Q5_0).astype(np.float64).T
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert q50_x8.mul_mat_step(be, a, view, x, out, None) is not None  # cached: no second repack
    assert q50_x8._cache[a][1] is q50_x8._repacked(a, view, False)


def test_weights_it_must_not_repack_fall_back(tmp_path, monkeypatch):
    raw, view = mapped_weight(tmp_path)
    be = CPUBackend(n_threads=1)
    x = np.ones((1, 896), np.float32)
    out = np.zeros((1, 48), np.float32)
    assert LAYOUTS[T.Q5_0] == "q50_x8"
    a = weight_tensor((48, 896))
    assert q50_x8.mul_mat_step(be, a, raw, x, out, None) is None  # in memory, not a mapped file
    assert q50_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True) is not None
    odd = weight_tensor((44, 896))
    assert q50_x8.mul_mat_step(be, odd, view[:44], x, out[:, :44], None) is None  # 44 % 8
    q51 = weight_tensor((48, 896), T.Q5_1)
    assert q50_x8.mul_mat_step(be, q51, view, x, out, None, any_memory=True) is None  # not in TYPES
    monkeypatch.setattr(q50_x8, "ENABLED", False)
    assert q50_x8.mul_mat_step(be, weight_tensor((48, 896)), view, x, out, None) is None


def test_q5_0_model_decodes_as_without_repacking(tmp_path, monkeypatch):
    """A small llama file quantized to pure Q5_0, prompt as one batch and token by token: against the
    NumPy backend (float activations), the repacked path's largest logit error is no larger than the plain
    kernels'."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.model import Model
    from llamapy.quantize import quantize_file
    from tests.quantize.models import write_model

    src = write_model("tied8", tmp_path / "tied8.gguf")
    path = tmp_path / "tied8-q50.gguf"
    quantize_file(src, path, "Q5_0", pure=True)
    toks = [1, 17, 42, 99, 200, 3]

    def logits(enabled: bool, backend: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(prompt as one batch: last logits, token by token: each token's logits)"""
        monkeypatch.setattr(q50_x8, "ENABLED", enabled)
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
            assert bool(q50_x8._cache) is enabled
        return batch, np.array(rows)

    rb, r1 = logits(False, "numpy")  # float activations, dequantized weights: the reference
    pb, p1 = logits(False)
    q50_x8._cache.clear()
    xb, x1 = logits(True)
    assert np.isfinite(xb).all() and np.isfinite(x1).all()
    scale = np.abs(r1).max()
    err_plain = max(np.abs(p1 - r1).max(), np.abs(pb - rb).max())
    err_x8 = max(np.abs(x1 - r1).max(), np.abs(xb - rb).max())
    assert err_plain < 0.01 * scale
    assert err_x8 <= 1.5 * err_plain + 1e-5 * scale
