"""Q4_K weights repacked eight rows at a time (``q4k_x8``): the layout round-trips bit for bit, the 8-row
kernel gives the plain kernel's result up to float summation order and ``W @ dequant(quant(x, Q8_K))``
in float64, the four-rows-per-pass kernel each row's result of the one-row kernel bit for bit,
non-finite activation rows give NaN rows, and ``mul_mat`` steps (one-row and four-row kernels, dequantized
tiles) on a memory-mapped weight agree with the plain path; weights it must not repack (rows not a
multiple of 8, not a mapped file, switched off) fall back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import kquant_kernels as kk
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import q4k_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.q4k_x8_kernels import mm_q4_k_x8, mm_q4_k_x8r4, unpack_x8_rows
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.tensor import Tensor
from tests.ggml.generic_target import run_on_generic_target

F16 = mk.F16_TABLE


def q4k(rows: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.1, 3, (rows, 1)).astype(np.float32)
    return np.asarray(quantize(w, T.Q4_K)).reshape(rows, -1)


def random_q4k_bytes(rows: int, K: int, seed: int) -> np.ndarray:
    """Every bit random except the halves (finite): all 6-bit scale/min codes occur."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, K // 256, 144), dtype=np.uint8)
    h = rng.uniform(-2, 2, (rows, K // 256, 2)).astype("<f2")
    raw[:, :, 0:4] = h.view(np.uint8)
    return raw.reshape(rows, -1)


def ref64(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    xd = dequantize(quantize(x, T.Q8_K), T.Q8_K).astype(np.float64)
    return xd @ dequantize(raw, T.Q4_K).astype(np.float64).T


@pytest.mark.parametrize("K", [256, 768, 1536])
def test_repack_round_trips_bit_for_bit(K):
    raw = random_q4k_bytes(24, K, K)
    R = q4k_x8.repack(raw)
    assert R.shape == (3, K // 256 * 1184)
    back = np.zeros_like(raw)
    unpack_x8_rows(R, 0, 24, back)
    np.testing.assert_array_equal(back, raw)
    part = np.zeros((7, raw.shape[1]), np.uint8)
    unpack_x8_rows(R, 5, 12, part)  # rows across a group boundary
    np.testing.assert_array_equal(part, raw[5:12])


@pytest.mark.parametrize(("N", "K"), [(8, 256), (24, 768), (64, 1536), (40, 2816)])
def test_x8_kernel_matches_plain_kernel_and_float64(N, K):
    raw = random_q4k_bytes(N, K, N + K) if N == 24 else q4k(N, K, N + K)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, K)).astype(np.float32)
    plain = np.zeros((3, N), np.float32)
    kk.mm_q4_k(raw, x, plain, F16)
    out = np.zeros((3, N), np.float32)
    mm_q4_k_x8(q4k_x8.repack(raw), x, out, 0)
    np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    ref = ref64(raw, x)
    assert float(((out - ref) ** 2).sum() / (ref**2).sum()) < 1e-11


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_x8_kernel_nonfinite_activation_rows_give_nan(bad):
    raw = q4k(16, 512, 2)
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((3, 16), np.float32)
    mm_q4_k_x8(q4k_x8.repack(raw), x, out, 0)
    assert np.isfinite(out[[0, 2]]).all()
    assert np.isnan(out[1]).all()


def test_x8_kernel_integer_sums_are_exact():
    """d, dmin powers of two and activations Q8_K keeps as integers: every float step is exact, so the
    result must equal the integer dot product bit for bit (the scale/min pairing, the nibble order)."""
    rng = np.random.default_rng(9)
    rows, K = 16, 768
    raw = random_q4k_bytes(rows, K, 4).reshape(rows, K // 256, 144)
    d = (np.float16(2.0) ** rng.integers(-8, -2, (rows, K // 256, 2))).astype("<f2")
    raw[:, :, 0:4] = d.view(np.uint8)
    raw = raw.reshape(rows, -1)
    x = rng.integers(-5, 6, (2, K)).astype(np.float32)
    x[:, ::256] = 127.0  # d8 = -1, xq = -x exactly
    expect = (x.astype(np.float64) @ dequantize(raw, T.Q4_K).astype(np.float64).T).astype(np.float32)
    out = np.zeros((2, rows), np.float32)
    mm_q4_k_x8(q4k_x8.repack(raw), x, out, 0)
    np.testing.assert_array_equal(out, expect)


def both_kernels(R: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``mm_q4_k_x8``, ``mm_q4_k_x8r4``) of ``x`` on ``R``, outputs prefilled with different garbage."""
    M, N = x.shape[0], R.shape[0] * 8
    one = np.full((M, N), -3.0, np.float32)
    four = np.full((M, N), 5.0, np.float32)
    mm_q4_k_x8(R, x, one, 0)
    mm_q4_k_x8r4(R, x, four, 0)
    return one, four


@pytest.mark.parametrize("M", [*range(1, 10), 67])
@pytest.mark.parametrize(("N", "K"), [(8, 256), (24, 768), (40, 2816)])
def test_r4_kernel_is_the_one_row_kernel_bit_for_bit(N, K, M):
    """Four rows per pass (the last 3 as a pass with the last row repeated, the last 1-2 one at a time):
    every row's result is the one-row kernel's, bit for bit (random bytes: all scale/min codes; rows of
    very different magnitudes)."""
    raw = random_q4k_bytes(N, K, N * K + M)
    rng = np.random.default_rng(M)
    x = (rng.standard_normal((M, K)) * rng.uniform(1e-3, 1e3, (M, 1))).astype(np.float32)
    one, four = both_kernels(q4k_x8.repack(raw), x)
    np.testing.assert_array_equal(four.view(np.uint32), one.view(np.uint32))
    assert np.isfinite(four).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_r4_kernel_nonfinite_activation_rows_give_nan(bad):
    """Non-finite rows in a pass of four, in the repeated last row of a pass of three and one at a time."""
    raw = q4k(16, 512, 6)
    R = q4k_x8.repack(raw)
    for M, rows in ((7, [1, 6]), (9, [2, 8]), (11, [10]), (4, [0, 1, 2, 3])):
        x = np.random.default_rng(M).standard_normal((M, 512)).astype(np.float32)
        x[rows, 100] = bad
        one, four = both_kernels(R, x)
        assert np.isnan(four[rows]).all()
        good = [m for m in range(M) if m not in rows]
        np.testing.assert_array_equal(four[good].view(np.uint32), one[good].view(np.uint32))
        assert np.isfinite(four[good]).all()


def test_step_kernel_by_row_count():
    """1-3 rows: one row per pass; 4 .. ``MAX_ROWS``: four rows per pass; more: tiles (None)."""
    assert q4k_x8.MAX_ROWS >= 256  # at least the rows the plain in-register kernels take
    for M in (1, 2, 3):
        assert q4k_x8.kernel(M) is mm_q4_k_x8
    for M in (4, 5, 16, 64, 256, q4k_x8.MAX_ROWS):
        assert q4k_x8.kernel(M) is mm_q4_k_x8r4
    assert q4k_x8.kernel(q4k_x8.MAX_ROWS + 1) is None


@pytest.fixture
def mapped(tmp_path: Path):
    """(raw, mapped view of the same bytes) for a 48 x 1536 Q4_K weight in a file, at a page offset."""
    raw = q4k(48, 1536, 5)
    p = tmp_path / "w.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return raw, mm[4096:].reshape(raw.shape)


def weight_tensor(shape: tuple[int, int]) -> Tensor:
    return ops.weight(
        "blk.0.ffn_up.weight", T.Q4_K, shape, np.zeros((shape[0], shape[1] // 256 * 144), np.uint8)
    )


@pytest.mark.parametrize("M", [1, 5, 300, q4k_x8.MAX_ROWS + 3])
def test_mul_mat_step_on_a_mapped_weight_matches_the_plain_path(mapped, M):
    raw, view = mapped
    a = weight_tensor((48, 1536))
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), -1.0, np.float32)
    step = q4k_x8.mul_mat_step(be, a, view, x, out, None)
    assert step is not None
    step()
    if M <= q4k_x8.MAX_ROWS:  # the 8-row kernels: the plain kernels' integer sums
        plain = np.zeros((M, 48), np.float32)
        mk.matvec_kernel("Q4_K", M)(raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
        one = np.zeros((M, 48), np.float32)
        mm_q4_k_x8(q4k_x8.repack(raw), x, one, 0)
        np.testing.assert_array_equal(out.view(np.uint32), one.view(np.uint32))
    else:  # dequantized tiles (unpacked from the repacked rows) + sgemm
        ref = x.astype(np.float64) @ dequantize(raw, T.Q4_K).astype(np.float64).T
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert q4k_x8.mul_mat_step(be, a, view, x, out, None) is not None  # cached: no second repack
    assert q4k_x8._cache[a][1] is q4k_x8._repacked(a, view, False)


def test_weights_it_must_not_repack_fall_back(mapped, monkeypatch):
    raw, view = mapped
    be = CPUBackend(n_threads=1)
    x = np.ones((1, 1536), np.float32)
    out = np.zeros((1, 48), np.float32)
    a = weight_tensor((48, 1536))
    assert q4k_x8.mul_mat_step(be, a, raw, x, out, None) is None  # in memory, not a mapped file
    assert q4k_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True) is not None
    odd = weight_tensor((44, 1536))
    assert q4k_x8.mul_mat_step(be, odd, view[:44], x, out[:, :44], None) is None  # 44 % 8
    view = Tensor(T.Q4_K, (48, 1536), "view", name="a view")
    assert q4k_x8.mul_mat_step(be, view, raw, x, out, None, any_memory=True) is None  # not a weight leaf
    monkeypatch.setattr(q4k_x8, "ENABLED", False)
    assert q4k_x8.mul_mat_step(be, weight_tensor((48, 1536)), view, x, out, None) is None


_GENERIC = """
import numpy as np
from llamapy._numba import njit
from llamapy.ggml.cpu.simd import vstore
from llamapy.ggml.cpu.x8simd import HAVE_F16C, xh8
assert not HAVE_F16C

@njit
def halves(b, out):
    for i in range(0, out.size, 8):
        vstore(out, i, xh8(b, 2 * i))

h = np.array([0, 0x8000, 1, 0x83FF, 0x3C00, 0xC000, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x0400, 0x3555] * 2, np.uint16)
got = np.zeros(h.size, np.float32)
halves(h.view(np.uint8), got)
want = h.view(np.float16).astype(np.float32)
assert np.array_equal(got, want, equal_nan=True), (got, want)
assert np.array_equal(np.signbit(got), np.signbit(want))
print("ok")
"""


def test_half_conversion_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no F16C, so ``xh8`` converts halves in integer IR (normals, subnormals,
    signed zeros, inf, NaN). The kernel's other generic pieces are ``isimd``'s (``maddubs``/``maddwd``
    without AVX2: tests/ggml/test_kquant_kernels.py); running the whole kernel here would compile it and
    the Q8_K quantizer for a second target (~40 s)."""
    run_on_generic_target(_GENERIC)


def test_tied_q4_k_model_decodes_as_without_repacking(tmp_path, monkeypatch):
    """A small llama file quantized to pure Q4_K (the output tied to ``token_embd``: ``get_rows`` reads the
    mapped bytes, ``mul_mat`` the repacked copy). This random-weight model amplifies float rounding
    (measured: the plain kernels' prompt-as-a-batch and token-by-token logits differ by 4 % of the largest
    logit; repacked vs plain 3.5 % and 1.9 %), so: the first token (one row through every layer) agrees
    tightly, and later logits differ from the plain kernels' by no more than the plain paths differ from
    each other."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.gguf.reader import GGUFReader
    from llamapy.model import Model
    from llamapy.quantize import quantize_file
    from tests.quantize.models import write_model

    src = write_model("tied8", tmp_path / "tied8.gguf")
    path = tmp_path / "tied8-q4k.gguf"
    quantize_file(src, path, "Q4_K_M", pure=True)
    with GGUFReader(path) as r:
        types = {t.name: t.ggml_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q4_K" and "output.weight" not in types
    toks = [1, 17, 42, 99, 200, 3]

    def logits(enabled: bool) -> tuple[np.ndarray, np.ndarray]:
        """(prompt as one batch: last logits, token by token: each token's logits)"""
        monkeypatch.setattr(q4k_x8, "ENABLED", enabled)
        model = Model.load(path)
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2))
        ctx.decode(Batch.from_tokens(toks, pos0=0))
        batch = ctx.get_logits()[-1].copy()
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2))
        rows = []
        for i, t in enumerate(toks):
            ctx.decode(Batch.from_tokens([t], pos0=i))
            rows.append(ctx.get_logits()[-1].copy())
        assert bool([t for t in q4k_x8._cache.keys() if t.name == "token_embd.weight"]) is enabled
        return batch, np.array(rows)

    pb, p1 = logits(False)
    xb, x1 = logits(True)
    assert np.isfinite(xb).all() and np.isfinite(x1).all()
    scale = np.abs(p1).max()
    np.testing.assert_allclose(x1[0], p1[0], rtol=0, atol=1e-5 * scale)
    spread = np.abs(pb - p1[-1]).max()  # the plain kernels' own batch vs token-by-token difference
    assert 1e-4 * scale < spread < 0.2 * scale
    assert np.abs(xb - pb).max() <= 2 * spread
    assert np.abs(x1 - p1).max() <= 2 * spread
