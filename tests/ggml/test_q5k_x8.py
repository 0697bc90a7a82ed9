"""Q5_K weights repacked eight rows at a time (``q5k_x8``): the layout round-trips bit for bit, the 8-row
kernel gives the plain kernel's result up to float summation order and ``W @ dequant(quant(x, Q8_K))``
in float64 (also with every 5-bit code at 31 against activations at 127: the 16-bit sums' worst case),
the four-rows-per-pass kernel gives the one-row kernel's bit for bit (any row count, non-finite rows
among them), both also as generic IR, non-finite activation rows give NaN rows, and ``mul_mat`` steps
(one-row kernel, four-row kernel, dequantized tiles) on a memory-mapped weight agree with the plain path;
weights it must not repack fall back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import kquant_kernels as kk
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import q5k_x8
from llamapy.ggml.cpu import q5k_x8_kernels as qk
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.q5k_x8_kernels import mm_q5_k_x8, mm_q5_k_x8r4, unpack_x8_rows
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.tensor import Tensor
from tests.ggml.generic_target import run_on_generic_target

F16 = mk.F16_TABLE
RB = 176  # bytes of one Q5_K block


def q5k(rows: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.1, 3, (rows, 1)).astype(np.float32)
    return np.asarray(quantize(w, T.Q5_K)).reshape(rows, -1)


def random_q5k_bytes(rows: int, K: int, seed: int) -> np.ndarray:
    """Every bit random except the halves (finite): all 6-bit scale/min codes and 5-bit quants occur."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, K // 256, RB), dtype=np.uint8)
    h = rng.uniform(-2, 2, (rows, K // 256, 2)).astype("<f2")
    raw[:, :, 0:4] = h.view(np.uint8)
    return raw.reshape(rows, -1)


def ref64(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    xd = dequantize(quantize(x, T.Q8_K), T.Q8_K).astype(np.float64)
    return xd @ dequantize(raw, T.Q5_K).astype(np.float64).T


@pytest.mark.parametrize("K", [256, 768, 1536])
def test_repack_round_trips_bit_for_bit(K):
    raw = random_q5k_bytes(24, K, K)
    R = q5k_x8.repack(raw)
    assert R.shape == (3, K // 256 * 1440)
    back = np.zeros_like(raw)
    unpack_x8_rows(R, 0, 24, back)
    np.testing.assert_array_equal(back, raw)
    part = np.zeros((7, raw.shape[1]), np.uint8)
    unpack_x8_rows(R, 5, 12, part)  # rows across a group boundary
    np.testing.assert_array_equal(part, raw[5:12])


@pytest.mark.parametrize(("N", "K"), [(8, 256), (24, 768), (64, 1536), (40, 2816)])
def test_x8_kernel_matches_plain_kernel_and_float64(N, K):
    raw = random_q5k_bytes(N, K, N + K) if N == 24 else q5k(N, K, N + K)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, K)).astype(np.float32)
    plain = np.zeros((3, N), np.float32)
    kk.mm_q5_k(raw, x, plain, F16)
    out = np.zeros((3, N), np.float32)
    mm_q5_k_x8(q5k_x8.repack(raw), x, out, 0)
    np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    ref = ref64(raw, x)
    assert float(((out - ref) ** 2).sum() / (ref**2).sum()) < 1e-11


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_x8_kernel_nonfinite_activation_rows_give_nan(bad):
    raw = q5k(16, 512, 2)
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((3, 16), np.float32)
    mm_q5_k_x8(q5k_x8.repack(raw), x, out, 0)
    assert np.isfinite(out[[0, 2]]).all()
    assert np.isnan(out[1]).all()


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 6, 7, 8, 9, 38])
def test_four_row_kernel_matches_one_row_kernel_bit_for_bit(M):
    raw = random_q5k_bytes(24, 768, M) if M % 2 else q5k(40, 1536, M)
    N, K = raw.shape[0], raw.shape[1] // RB * 256
    rng = np.random.default_rng(M)
    x = rng.standard_normal((M, K)).astype(np.float32) * rng.uniform(0.01, 100, (M, 1)).astype(np.float32)
    if M >= 3:
        x[1, 5] = np.nan
        x[M - 1, K - 1] = np.inf if M % 2 else -np.inf  # the row a trailing group of 4 repeats
    R = q5k_x8.repack(raw)
    one, four = np.zeros((M, N), np.float32), np.full((M, N), -1.0, np.float32)
    mm_q5_k_x8(R, x, one, 0)
    mm_q5_k_x8r4(R, x, four, 0)
    np.testing.assert_array_equal(four, one)
    bad = ~np.isfinite(x).all(axis=1)
    assert np.isnan(four[bad]).all() and np.isfinite(four[~bad]).all()


def test_four_row_kernel_worst_case_16_bit_sums_and_exact_integers():
    """The 16-bit sums at their largest (every quant 31, scale 63, activations +-127) and exactly
    representable steps: four rows per pass give the one-row kernel's (exact) results."""
    rng = np.random.default_rng(12)
    rows, K = 8, 512
    raw = np.full((rows, K // 256, RB), 0xFF, np.uint8)
    raw[:, :, 4:16] = [63] * 4 + [0] * 4 + [0x0F] * 4
    raw = _pow2_halves(raw.reshape(rows, -1), rng)
    ints = _pow2_halves(random_q5k_bytes(rows, K, 6), rng)
    x = np.concatenate([np.ones((2, K), np.float32), -np.ones((2, K), np.float32)])
    xi = rng.integers(-5, 6, (5, K)).astype(np.float32)
    xi[:, ::256] = 127.0
    for w, xx in ((raw, x), (ints, xi)):
        R = q5k_x8.repack(w)
        one, four = np.zeros((len(xx), rows), np.float32), np.zeros((len(xx), rows), np.float32)
        mm_q5_k_x8(R, xx, one, 0)
        mm_q5_k_x8r4(R, xx, four, 0)
        np.testing.assert_array_equal(four, one)
    expect = (xi.astype(np.float64) @ dequantize(ints, T.Q5_K).astype(np.float64).T).astype(np.float32)
    np.testing.assert_array_equal(four, expect)


_GENERIC = """
import numpy as np
from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import isimd, kquant_kernels as kk, matmul_kernels as mk, q5k_x8
from llamapy.ggml.cpu.q5k_x8_kernels import mm_q5_k_x8, mm_q5_k_x8r4
from llamapy.ggml.quants import quantize
assert not isimd.HAVE_AVX2
rng = np.random.default_rng(5)
raw = np.asarray(quantize(rng.standard_normal((16, 768)).astype(np.float32), T.Q5_K)).reshape(16, -1)
x = rng.standard_normal((7, 768)).astype(np.float32)
plain = np.zeros((7, 16), np.float32)
kk.mm_q5_k(raw, x, plain, mk.F16_TABLE)
R = q5k_x8.repack(raw)
one, four = np.zeros((7, 16), np.float32), np.zeros((7, 16), np.float32)
mm_q5_k_x8(R, x, one, 0)
mm_q5_k_x8r4(R, x, four, 0)
np.testing.assert_allclose(one, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
np.testing.assert_array_equal(four, one)
print("ok")
"""


def test_x8_kernels_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no AVX2 or F16C, so ``pmaddubsw`` / ``pmaddwd`` / ``vcvtph2ps`` are generic
    IR (the decoding, shifts and shuffles are generic IR on every target)."""
    run_on_generic_target(_GENERIC)


def _pow2_halves(raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    rows, nb = raw.shape[0], raw.shape[1] // RB
    raw = raw.reshape(rows, nb, RB)
    d = (np.float16(2.0) ** rng.integers(-8, -2, (rows, nb, 2))).astype("<f2")
    raw[:, :, 0:4] = d.view(np.uint8)
    return raw.reshape(rows, -1)


def test_x8_kernel_integer_sums_are_exact():
    """d, dmin powers of two and activations Q8_K keeps as integers: every float step is exact, so the
    result must equal the integer dot product bit for bit (the fifth bits, scale/min pairing, nibbles)."""
    rng = np.random.default_rng(9)
    rows, K = 16, 768
    raw = _pow2_halves(random_q5k_bytes(rows, K, 4), rng)
    x = rng.integers(-5, 6, (2, K)).astype(np.float32)
    x[:, ::256] = 127.0  # d8 = -1, xq = -x exactly
    expect = (x.astype(np.float64) @ dequantize(raw, T.Q5_K).astype(np.float64).T).astype(np.float32)
    out = np.zeros((2, rows), np.float32)
    mm_q5_k_x8(q5k_x8.repack(raw), x, out, 0)
    np.testing.assert_array_equal(out, expect)


def test_x8_kernel_worst_case_16_bit_sums():
    """Every quant 31 (all nibbles 15, all fifth bits set), every scale 63, min 0, activations all at
    +127 or all at -127 after Q8_K: the 16-bit partial sums at their largest (8 x 31 x 127 = 31496)."""
    rng = np.random.default_rng(11)
    rows, K = 8, 512
    raw = np.full((rows, K // 256, RB), 0xFF, np.uint8)
    raw[:, :, 4:16] = [63] * 4 + [0] * 4 + [0x0F] * 4  # scales 63, mins 0 (get_scale_min_k4)
    raw = _pow2_halves(raw.reshape(rows, -1), rng)
    assert (dequantize(raw, T.Q5_K).reshape(rows, K // 256, 256) > 0).all()
    for sign in (1.0, -1.0):
        x = np.full((1, K), sign, np.float32)  # Q8_K: every byte -127 with d8 = -1/127 (exact sums)
        expect = ref64(raw, x)
        out = np.zeros((1, rows), np.float32)
        mm_q5_k_x8(q5k_x8.repack(raw), x, out, 0)
        np.testing.assert_allclose(out, expect, rtol=1e-6)
        plain = np.zeros((1, rows), np.float32)
        kk.mm_q5_k(raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=1e-6)


@pytest.fixture
def mapped(tmp_path: Path):
    """(raw, mapped view of the same bytes) for a 48 x 1536 Q5_K weight in a file, at a page offset."""
    raw = q5k(48, 1536, 5)
    p = tmp_path / "w.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return raw, mm[4096:].reshape(raw.shape)


def weight_tensor(shape: tuple[int, int]) -> Tensor:
    return ops.weight(
        "blk.0.ffn_down.weight", T.Q5_K, shape, np.zeros((shape[0], shape[1] // 256 * RB), np.uint8)
    )


@pytest.mark.parametrize("M", [1, 3, 4, 5, 64, 256, 257, 300, 513])
def test_mul_mat_step_on_a_mapped_weight_matches_the_plain_path(mapped, M, monkeypatch):
    raw, view = mapped
    a = weight_tensor((48, 1536))
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), -1.0, np.float32)
    ran = []
    for name in ("mm_q5_k_x8", "mm_q5_k_x8r4"):
        kern = getattr(qk, name)
        monkeypatch.setattr(qk, name, lambda *args, k=kern, n=name: (ran.append(n), k(*args)))
    step = q5k_x8.mul_mat_step(be, a, view, x, out, None)
    assert step is not None
    step()
    # 1-3 rows: the one-row kernel; 4 .. MAX_ROWS: four rows per pass, past CHUNK_ROWS one call per chunk
    # of rows; more: tiles
    calls = -(-M // q5k_x8.CHUNK_ROWS)
    assert ran == ([] if M > q5k_x8.MAX_ROWS else ["mm_q5_k_x8r4" if M >= 4 else "mm_q5_k_x8"] * calls)
    if M <= q5k_x8.MAX_ROWS:  # the 8-row kernels: the plain kernels' integer sums
        plain = np.zeros((M, 48), np.float32)
        mk.matvec_kernel("Q5_K", M)(raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    else:  # dequantized tiles (unpacked from the repacked rows) + sgemm
        ref = x.astype(np.float64) @ dequantize(raw, T.Q5_K).astype(np.float64).T
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert q5k_x8.mul_mat_step(be, a, view, x, out, None) is not None  # cached: no second repack
    assert q5k_x8._cache[a][1] is q5k_x8._repacked(a, view, False)


@pytest.mark.parametrize("M", [257, 300, q5k_x8.MAX_ROWS])
def test_chunks_of_rows_give_the_bits_of_one_call(mapped, M):
    """Past ``CHUNK_ROWS`` the step calls the kernel once per chunk of rows: the same bits as one call on
    all of them (a row's result does not depend on the other rows of a call)."""
    raw, view = mapped
    a = weight_tensor((48, 1536))
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), np.nan, np.float32)
    q5k_x8.mul_mat_step(be, a, view, x, out, None)()
    whole = np.full((M, 48), np.nan, np.float32)
    qk.mm_q5_k_x8r4(q5k_x8._cache[a][1], x, whole, 0)
    assert np.array_equal(out.view(np.uint32), whole.view(np.uint32))


def test_weights_it_must_not_repack_fall_back(mapped, monkeypatch):
    raw, view = mapped
    be = CPUBackend(n_threads=1)
    x = np.ones((1, 1536), np.float32)
    out = np.zeros((1, 48), np.float32)
    a = weight_tensor((48, 1536))
    assert q5k_x8.mul_mat_step(be, a, raw, x, out, None) is None  # in memory, not a mapped file
    assert q5k_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True) is not None
    odd = weight_tensor((44, 1536))
    assert q5k_x8.mul_mat_step(be, odd, view[:44], x, out[:, :44], None) is None  # 44 % 8
    v = Tensor(T.Q5_K, (48, 1536), "view", name="a view")
    assert q5k_x8.mul_mat_step(be, v, raw, x, out, None, any_memory=True) is None  # not a weight leaf
    q4 = ops.weight("q4", T.Q4_K, (48, 1536), np.zeros((48, 6 * 144), np.uint8))
    assert q5k_x8.mul_mat_step(be, q4, view, x, out, None) is None  # another type
    monkeypatch.setattr(q5k_x8, "ENABLED", False)
    assert q5k_x8.mul_mat_step(be, weight_tensor((48, 1536)), view, x, out, None) is None


def test_tied_q5_k_model_decodes_as_without_repacking(tmp_path, monkeypatch):
    """A small llama file quantized to pure Q5_K (the output tied to ``token_embd``: ``get_rows`` reads the
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
    path = tmp_path / "tied8-q5k.gguf"
    quantize_file(src, path, "Q5_K_M", pure=True)
    with GGUFReader(path) as r:
        types = {t.name: t.ggml_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q5_K" and "output.weight" not in types
    toks = [1, 17, 42, 99, 200, 3]

    def logits(enabled: bool) -> tuple[np.ndarray, np.ndarray]:
        monkeypatch.setattr(q5k_x8, "ENABLED", enabled)
        model = Model.load(path)
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2))
        ctx.decode(Batch.from_tokens(toks, pos0=0))
        batch = ctx.get_logits()[-1].copy()
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2))
        rows = []
        for i, t in enumerate(toks):
            ctx.decode(Batch.from_tokens([t], pos0=i))
            rows.append(ctx.get_logits()[-1].copy())
        assert bool([t for t in q5k_x8._cache.keys() if t.name == "token_embd.weight"]) is enabled
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
