"""Q6_K weights repacked eight rows at a time (``q6k_x8``): the layout round-trips bit for bit, the 8-row
kernels give the plain kernel's result up to float summation order and ``W @ dequant(quant(x, Q8_K))``
in float64 (also at the 16-bit sums' extremes: every code 0 or 63 against activations at +-127), the
four-rows-per-pass kernel equals the one-row kernel bit for bit, non-finite activation rows give NaN
rows, the generic (non-AVX2) IR agrees, and ``mul_mat`` steps (8-row kernels, dequantized tiles) on a
memory-mapped weight agree with the plain path; weights it must not repack fall back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import kquant_kernels as kk
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import q6k_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.q6k_x8_kernels import mm_q6_k_x8, mm_q6_k_x8r4, unpack_x8_rows
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.tensor import Tensor
from tests.ggml.generic_target import run_on_generic_target

F16 = mk.F16_TABLE
RB = 210  # bytes of one Q6_K block
KERNELS = [mm_q6_k_x8, mm_q6_k_x8r4]


def q6k(rows: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.1, 3, (rows, 1)).astype(np.float32)
    return np.asarray(quantize(w, T.Q6_K)).reshape(rows, -1)


def random_q6k_bytes(rows: int, K: int, seed: int) -> np.ndarray:
    """Every bit random except ``d`` (finite): all 6-bit codes and signed 8-bit scales occur."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, K // 256, RB), dtype=np.uint8)
    raw[:, :, 208:210] = rng.uniform(-2, 2, (rows, K // 256, 1)).astype("<f2").view(np.uint8)
    return raw.reshape(rows, -1)


def ref64(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    xd = dequantize(quantize(x, T.Q8_K), T.Q8_K).astype(np.float64)
    return xd @ dequantize(raw, T.Q6_K).astype(np.float64).T


@pytest.mark.parametrize("K", [256, 768, 1536])
def test_repack_round_trips_bit_for_bit(K):
    raw = random_q6k_bytes(24, K, K)
    R = q6k_x8.repack(raw)
    assert R.shape == (3, K // 256 * 1680) and R.nbytes == raw.nbytes
    back = np.zeros_like(raw)
    unpack_x8_rows(R, 0, 24, back)
    np.testing.assert_array_equal(back, raw)
    part = np.zeros((7, raw.shape[1]), np.uint8)
    unpack_x8_rows(R, 5, 12, part)  # rows across a group boundary
    np.testing.assert_array_equal(part, raw[5:12])


@pytest.mark.parametrize(("N", "K"), [(8, 256), (24, 768), (64, 1536), (40, 2816)])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 64])
def test_x8_kernels_match_plain_kernel_and_float64(N, K, M):
    raw = random_q6k_bytes(N, K, N + K) if N == 24 else q6k(N, K, N + K)
    x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
    plain = np.zeros((M, N), np.float32)
    kk.mm_q6_k(raw, x, plain, F16)
    R = q6k_x8.repack(raw)
    one, four = np.zeros((M, N), np.float32), np.zeros((M, N), np.float32)
    mm_q6_k_x8(R, x, one, 0)
    mm_q6_k_x8r4(R, x, four, 0)
    np.testing.assert_allclose(one, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    np.testing.assert_array_equal(four, one)
    ref = ref64(raw, x)
    assert float(((one - ref) ** 2).sum() / (ref**2).sum()) < 1e-11


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kern", KERNELS)
def test_x8_kernels_nonfinite_activation_rows_give_nan(bad, kern):
    raw = q6k(16, 512, 2)
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((5, 16), np.float32)
    kern(q6k_x8.repack(raw), x, out, 0)
    assert np.isfinite(np.delete(out, 1, 0)).all()
    assert np.isnan(out[1]).all()


def _pow2_d(raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    rows, nb = raw.shape[0], raw.shape[1] // RB
    raw = raw.reshape(rows, nb, RB)
    d = (np.float16(2.0) ** rng.integers(-12, -6, (rows, nb, 1))).astype("<f2")
    raw[:, :, 208:210] = d.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kern", KERNELS)
def test_x8_kernels_integer_sums_are_exact(kern):
    """d a power of two and activations Q8_K keeps as integers: every float step is exact, so the result
    must equal the integer dot product bit for bit (the code bits' places, the scales' rows, the -32)."""
    rng = np.random.default_rng(9)
    rows, K = 16, 768
    raw = _pow2_d(random_q6k_bytes(rows, K, 4), rng)
    x = rng.integers(-5, 6, (5, K)).astype(np.float32)
    x[:, ::256] = 127.0  # d8 = -1, xq = -x exactly
    expect = (x.astype(np.float64) @ dequantize(raw, T.Q6_K).astype(np.float64).T).astype(np.float32)
    out = np.zeros((5, rows), np.float32)
    kern(q6k_x8.repack(raw), x, out, 0)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("code", [0, 63])
def test_x8_kernels_extreme_16_bit_sums(code):
    """Every code 0 (weight -32) or 63 (+31), scales -128 and 127, activations all +127 or all -127 after
    Q8_K: each 16-bit lane ends at 8 x 32 x 127 = 32512 in magnitude (its partial sums wrap)."""
    rng = np.random.default_rng(11)
    rows, K = 8, 512
    raw = np.zeros((rows, K // 256, RB), np.uint8)
    lo, hi = (0, 0) if code == 0 else (0xFF, 0xFF)
    raw[:, :, 0:128], raw[:, :, 128:192] = lo, hi
    raw[:, :, 192:208] = np.array([-128, 127] * 8, np.int8).view(np.uint8)
    raw = _pow2_d(raw.reshape(rows, -1), rng)
    for sign in (1.0, -1.0):
        x = np.full((4, K), sign, np.float32)  # Q8_K: every byte -127 with d8 = -1/127
        expect = ref64(raw, x)
        plain = np.zeros((4, rows), np.float32)
        kk.mm_q6_k(raw, x, plain, F16)
        for kern in KERNELS:
            out = np.zeros((4, rows), np.float32)
            kern(q6k_x8.repack(raw), x, out, 0)
            np.testing.assert_allclose(out, expect, rtol=1e-6)
            np.testing.assert_allclose(out, plain, rtol=1e-6)


_GENERIC = """
import numpy as np
from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import isimd, kquant_kernels as kk, matmul_kernels as mk, q6k_x8
from llamapy.ggml.cpu.q6k_x8_kernels import mm_q6_k_x8, mm_q6_k_x8r4
from llamapy.ggml.quants import quantize
assert not isimd.HAVE_AVX2
rng = np.random.default_rng(5)
raw = np.asarray(quantize(rng.standard_normal((16, 768)).astype(np.float32), T.Q6_K)).reshape(16, -1)
x = rng.standard_normal((5, 768)).astype(np.float32)
plain = np.zeros((5, 16), np.float32)
kk.mm_q6_k(raw, x, plain, mk.F16_TABLE)
R = q6k_x8.repack(raw)
for kern in (mm_q6_k_x8, mm_q6_k_x8r4):
    out = np.zeros((5, 16), np.float32)
    kern(R, x, out, 0)
    np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
print("ok")
"""


def test_x8_kernels_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no AVX2 or F16C, so ``pmaddubsw`` / ``pmaddwd`` / ``vcvtph2ps`` are generic
    IR (the decoding, shifts and shuffles are generic IR on every target)."""
    run_on_generic_target(_GENERIC)


@pytest.fixture
def mapped(tmp_path: Path):
    """(raw, mapped view of the same bytes) for a 48 x 1536 Q6_K weight in a file, at a page offset."""
    raw = q6k(48, 1536, 5)
    p = tmp_path / "w.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return raw, mm[4096:].reshape(raw.shape)


def weight_tensor(shape: tuple[int, int]) -> Tensor:
    return ops.weight(
        "blk.0.ffn_down.weight", T.Q6_K, shape, np.zeros((shape[0], shape[1] // 256 * RB), np.uint8)
    )


@pytest.mark.parametrize("M", [1, 5, 300])
def test_mul_mat_step_on_a_mapped_weight_matches_the_plain_path(mapped, M):
    raw, view = mapped
    a = weight_tensor((48, 1536))
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), -1.0, np.float32)
    step = q6k_x8.mul_mat_step(be, a, view, x, out, None)
    assert step is not None
    step()
    if M <= q6k_x8.MAX_ROWS:  # the 8-row kernels: the plain kernels' integer sums
        plain = np.zeros((M, 48), np.float32)
        kk.mm_q6_k(raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    else:  # dequantized tiles (unpacked from the repacked rows) + sgemm
        ref = x.astype(np.float64) @ dequantize(raw, T.Q6_K).astype(np.float64).T
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert q6k_x8.mul_mat_step(be, a, view, x, out, None) is not None  # cached: no second repack
    assert q6k_x8._cache[a][1] is q6k_x8._repacked(a, view, False)


def test_weights_it_must_not_repack_fall_back(mapped, monkeypatch):
    raw, view = mapped
    be = CPUBackend(n_threads=1)
    x = np.ones((1, 1536), np.float32)
    out = np.zeros((1, 48), np.float32)
    a = weight_tensor((48, 1536))
    assert q6k_x8.mul_mat_step(be, a, raw, x, out, None) is None  # in memory, not a mapped file
    assert q6k_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True) is not None
    odd = weight_tensor((44, 1536))
    assert q6k_x8.mul_mat_step(be, odd, view[:44], x, out[:, :44], None) is None  # 44 % 8
    v = Tensor(T.Q6_K, (48, 1536), "view", name="a view")
    assert q6k_x8.mul_mat_step(be, v, raw, x, out, None, any_memory=True) is None  # not a weight leaf
    q4 = ops.weight("q4", T.Q4_K, (48, 1536), np.zeros((48, 6 * 144), np.uint8))
    assert q6k_x8.mul_mat_step(be, q4, view, x, out, None) is None  # another type
    monkeypatch.setattr(q6k_x8, "ENABLED", False)
    assert q6k_x8.mul_mat_step(be, weight_tensor((48, 1536)), view, x, out, None) is None


def test_tied_q6_k_model_decodes_as_without_repacking(tmp_path, monkeypatch):
    """A small llama file quantized to pure Q6_K (the output tied to ``token_embd``: ``get_rows`` reads the
    mapped bytes, ``mul_mat`` the repacked copy), through ``Context.decode``: the first token (one row
    through every layer) agrees tightly with the plain kernels, later logits (this random-weight model
    amplifies float rounding: see test_q4k_x8) by no more than the plain batch and token paths differ."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.gguf.reader import GGUFReader
    from llamapy.model import Model
    from llamapy.quantize import quantize_file
    from tests.quantize.models import write_model

    src = write_model("tied8", tmp_path / "tied8.gguf")
    path = tmp_path / "tied8-q6k.gguf"
    quantize_file(src, path, "Q6_K", pure=True)
    with GGUFReader(path) as r:
        types = {t.name: t.ggml_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q6_K" and "output.weight" not in types
    toks = [1, 17, 42, 99, 200, 3]

    def logits(enabled: bool) -> tuple[np.ndarray, np.ndarray]:
        monkeypatch.setattr(q6k_x8, "ENABLED", enabled)
        model = Model.load(path)
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2))
        ctx.decode(Batch.from_tokens(toks, pos0=0))
        batch = ctx.get_logits()[-1].copy()
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2))
        rows = []
        for i, t in enumerate(toks):
            ctx.decode(Batch.from_tokens([t], pos0=i))
            rows.append(ctx.get_logits()[-1].copy())
        assert bool([t for t in q6k_x8._cache.keys() if t.name == "token_embd.weight"]) is enabled
        return batch, np.array(rows)

    pb, p1 = logits(False)
    xb, x1 = logits(True)
    assert np.isfinite(xb).all() and np.isfinite(x1).all()
    scale = np.abs(p1).max()
    np.testing.assert_allclose(x1[0], p1[0], rtol=0, atol=1e-5 * scale)
    spread = np.abs(pb - p1[-1]).max()  # the plain kernels' own batch vs token-by-token difference
    assert spread < 0.2 * scale
    assert np.abs(xb - pb).max() <= 2 * max(spread, 1e-4 * scale)
    assert np.abs(x1 - p1).max() <= 2 * max(spread, 1e-4 * scale)
