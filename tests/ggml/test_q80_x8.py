"""Q8_0 weights repacked eight rows at a time (``q80_x8``): the layout round-trips bit for bit, the
8-row kernels give the plain 16-bit-activation kernel's result (``mm16_q8_0``) up to float summation
order and ``W @ (x quantized to 16 bits)`` in float64, bit for bit where every float step is exact, the
four-row kernel each row's one-row result bit for bit, non-finite activation rows give NaN rows, and
``mul_mat`` steps (8-row kernels, dequantized tiles) on a memory-mapped weight agree with the plain
path; weights it must not repack fall back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.cpu import q16_kernels as qk
from llamapy.ggml.cpu import q80_x8
from llamapy.ggml.cpu.backend import CPUBackend
from llamapy.ggml.cpu.hsimd import quantize_rows_q16
from llamapy.ggml.cpu.q80_x8_kernels import mm_q8_0_x8, mm_q8_0_x8r4
from llamapy.ggml.cpu.repack import LAYOUTS
from llamapy.ggml.quants import dequantize, quantize
from llamapy.ggml.tensor import Tensor
from tests.ggml.generic_target import run_on_generic_target

F16 = mk.F16_TABLE


def weights(rows: int, K: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.1, 3, (rows, 1)).astype(np.float32)
    return np.asarray(quantize(w, T.Q8_0)).reshape(rows, -1)


def random_bytes(rows: int, K: int, seed: int) -> np.ndarray:
    """Every bit random except the halves (finite): all byte values (-128 too) in every position."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, K // 32, 34), dtype=np.uint8)
    raw[:, :, :2] = rng.uniform(-2, 2, (rows, K // 32, 1)).astype("<f2").view(np.uint8)
    return raw.reshape(rows, -1)


def q16(x: np.ndarray) -> np.ndarray:
    """x as the kernels see it: quantized to 16 bits per 32 elements, in float64."""
    M, K = x.shape
    xq = np.empty((M, K), np.int16)
    xd = np.empty((M, K // 32), np.float32)
    xs = np.empty((M, K // 32), np.float32)
    quantize_rows_q16(x, xq, xd, xs)
    return (xq.reshape(M, -1, 32).astype(np.float64) * xd[:, :, None]).reshape(M, K)


def test_registered_as_the_q8_0_layout():
    assert LAYOUTS[T.Q8_0] == "q80_x8"


@pytest.mark.parametrize("K", [32, 96, 1536])
def test_repack_round_trips_bit_for_bit(K):
    raw = random_bytes(24, K, K)
    R = q80_x8.repack(raw)
    assert R.shape == (3, raw.shape[1] * 8)  # the same bytes, moved
    back = np.zeros_like(raw)
    q80_x8.unpack_rows(R, 0, 24, back)
    np.testing.assert_array_equal(back, raw)
    part = np.zeros((7, raw.shape[1]), np.uint8)
    q80_x8.unpack_rows(R, 5, 12, part)  # rows across a group boundary
    np.testing.assert_array_equal(part, raw[5:12])


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 64, 256])
@pytest.mark.parametrize(("N", "K"), [(8, 32), (24, 96), (64, 1536), (40, 2816)])
def test_x8_kernels_match_plain_kernel_and_float64(N, K, M):
    raw = random_bytes(N, K, N + K) if N == 24 else weights(N, K, N + K)
    x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
    plain = np.zeros((M, N), np.float32)
    qk.mm16_q8_0(raw, x, plain, F16)  # the plain one-row kernel, row by row: its integer sums
    R = q80_x8.repack(raw)
    ref = q16(x) @ dequantize(raw, T.Q8_0).astype(np.float64).T
    for kern in (mm_q8_0_x8, mm_q8_0_x8r4):
        out = np.zeros((M, N), np.float32)
        kern(R, x, out, 0)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
        assert float(((out - ref) ** 2).sum() / (ref**2).sum()) < 1e-12


def test_x8_kernel_integer_sums_are_exact():
    """Scales powers of two and activations that 16-bit quantization keeps as integers (each block's
    largest is 32767: scale 1): every float step is exact, so the result must equal the integer dot
    product bit for bit (the byte order of the layout, the sign extension, -128 included)."""
    rng = np.random.default_rng(9)
    rows, K = 16, 256
    raw = random_bytes(rows, K, 4).reshape(rows, K // 32, 34)
    d = (np.float16(2.0) ** rng.integers(-4, -2, (rows, K // 32, 1))).astype("<f2")
    raw[:, :, 0:2] = d.view(np.uint8)
    raw[0, :, 2:] = 0x80  # -128 in row 0
    small = rng.integers(-3, 4, (rows, K // 32, 2)).astype(np.int8).view(np.uint8)
    raw[:, :, [2, 7]] = small  # the weights of the +-32767 activations: the sums stay below 2^24
    raw = raw.reshape(rows, -1)
    x = rng.integers(-5, 6, (5, K)).astype(np.float32)
    x[:, ::32] = 32767.0
    x[1, 5::32] = -32767.0
    expect = (x.astype(np.float64) @ dequantize(raw, T.Q8_0).astype(np.float64).T).astype(np.float32)
    R = q80_x8.repack(raw)
    for kern in (mm_q8_0_x8, mm_q8_0_x8r4):
        out = np.zeros((5, rows), np.float32)
        kern(R, x, out, 0)
        np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("M", [1, 3, 4, 6, 9])
def test_four_row_kernel_equals_one_row_kernel_bit_for_bit(M):
    """A row's result does not depend on how many rows a pass takes (prompt vs decode)."""
    raw = random_bytes(24, 1536, M)
    R = q80_x8.repack(raw)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    x[M // 2, 7] = np.nan
    one, four = np.zeros((M, 24), np.float32), np.zeros((M, 24), np.float32)
    mm_q8_0_x8(R, x, one, 0)
    mm_q8_0_x8r4(R, x, four, 0)
    np.testing.assert_array_equal(four, one)
    assert np.isnan(four[M // 2]).all() and np.isfinite(np.delete(four, M // 2, 0)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kern", [mm_q8_0_x8, mm_q8_0_x8r4])
def test_x8_kernels_nonfinite_activation_rows_give_nan(bad, kern):
    raw = weights(16, 512, 2)
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((5, 16), np.float32)
    kern(q80_x8.repack(raw), x, out, 0)
    assert np.isfinite(np.delete(out, 1, 0)).all()
    assert np.isnan(out[1]).all()


_GENERIC = """
import numpy as np
from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import isimd, matmul_kernels as mk, q16_kernels as qk, q80_x8
from llamapy.ggml.cpu.q80_x8_kernels import mm_q8_0_x8, mm_q8_0_x8r4
from llamapy.ggml.quants import quantize
assert not isimd.HAVE_AVX2
rng = np.random.default_rng(5)
raw = np.asarray(quantize(rng.standard_normal((16, 768)).astype(np.float32), T.Q8_0)).reshape(16, -1)
x = rng.standard_normal((5, 768)).astype(np.float32)
plain = np.zeros((5, 16), np.float32)
qk.mm16_q8_0(raw, x, plain, mk.F16_TABLE)
R = q80_x8.repack(raw)
for kern in (mm_q8_0_x8, mm_q8_0_x8r4):
    out = np.zeros((5, 16), np.float32)
    kern(R, x, out, 0)
    np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
print("ok")
"""


def test_x8_kernels_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no AVX2, so ``hmadd`` is the generic widened multiply-add IR."""
    run_on_generic_target(_GENERIC)


@pytest.fixture
def mapped(tmp_path: Path):
    """(raw, mapped view of the same bytes) for a 48 x 1536 Q8_0 weight in a file, at a page offset."""
    raw = weights(48, 1536, 5)
    p = tmp_path / "w.bin"
    p.write_bytes(b"\0" * 4096 + raw.tobytes())
    mm = np.memmap(p, mode="r", dtype=np.uint8)
    return raw, mm[4096:].reshape(raw.shape)


def weight_tensor(shape: tuple[int, int]) -> Tensor:
    return ops.weight(
        "blk.0.ffn_up.weight", T.Q8_0, shape, np.zeros((shape[0], shape[1] // 32 * 34), np.uint8)
    )


@pytest.mark.parametrize("M", [1, 2, 3, 5, 40, 300, 520])
def test_mul_mat_step_on_a_mapped_weight_matches_the_plain_path(mapped, M, monkeypatch):
    monkeypatch.setattr(q80_x8, "ENABLED", True)
    raw, view = mapped
    a = weight_tensor((48, 1536))
    be = CPUBackend(n_threads=2)
    x = np.random.default_rng(M).standard_normal((M, 1536)).astype(np.float32)
    out = np.full((M, 48), -1.0, np.float32)
    step = q80_x8.mul_mat_step(be, a, view, x, out, None)
    assert step is not None
    step()
    if M <= q80_x8.MAX_ROWS:  # the 8-row kernels: the plain one-row kernel's integer sums
        plain = np.zeros((M, 48), np.float32)
        qk.mm16_q8_0(raw, x, plain, F16)
        np.testing.assert_allclose(out, plain, rtol=2e-6, atol=2e-6 * np.abs(plain).max())
    else:  # dequantized tiles (unpacked from the repacked rows) + sgemm
        ref = x.astype(np.float64) @ dequantize(raw, T.Q8_0).astype(np.float64).T
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert q80_x8.mul_mat_step(be, a, view, x, out, None) is not None  # cached: no second repack
    assert q80_x8._cache[a][1] is q80_x8._repacked(a, view, False)


def test_weights_it_must_not_repack_fall_back(mapped, monkeypatch):
    monkeypatch.setattr(q80_x8, "ENABLED", True)
    raw, view = mapped
    be = CPUBackend(n_threads=1)
    x = np.ones((1, 1536), np.float32)
    out = np.zeros((1, 48), np.float32)
    a = weight_tensor((48, 1536))
    assert q80_x8.mul_mat_step(be, a, raw, x, out, None) is None  # in memory, not a mapped file
    assert q80_x8.mul_mat_step(be, a, raw, x, out, None, any_memory=True) is not None
    odd = weight_tensor((44, 1536))
    assert q80_x8.mul_mat_step(be, odd, view[:44], x, out[:, :44], None) is None  # 44 % 8
    view_t = Tensor(T.Q8_0, (48, 1536), "view", name="a view")
    assert q80_x8.mul_mat_step(be, view_t, raw, x, out, None, any_memory=True) is None  # not a leaf
    q40 = ops.weight("w40", T.Q4_0, (48, 1536), np.zeros((48, 1536 // 32 * 18), np.uint8))
    assert q80_x8.mul_mat_step(be, q40, view, x, out, None, any_memory=True) is None  # not in TYPES
    monkeypatch.setattr(q80_x8, "ENABLED", False)
    assert q80_x8.mul_mat_step(be, weight_tensor((48, 1536)), view, x, out, None) is None


def test_tied_q8_0_model_decodes_as_without_repacking(tmp_path, monkeypatch):
    """A small llama file quantized to pure Q8_0 (the output tied to ``token_embd``: ``get_rows`` reads the
    mapped bytes, ``mul_mat`` the repacked copy), prompt as one batch (the four-row kernel, 16-bit
    activations where the plain batch kernels multiply floats) and token by token: against the NumPy
    backend (float activations), the repacked path's largest logit error stays within the plain
    kernels' order (both far below 8-bit activations')."""
    from llamapy.batch import Batch
    from llamapy.context import Context, ContextParams
    from llamapy.gguf.reader import GGUFReader
    from llamapy.model import Model
    from llamapy.quantize import quantize_file
    from tests.quantize.models import write_model

    src = write_model("tied8", tmp_path / "tied8.gguf")
    path = tmp_path / "tied8-q80.gguf"
    quantize_file(src, path, "Q8_0", pure=True)
    with GGUFReader(path) as r:
        types = {t.name: t.ggml_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "Q8_0" and "output.weight" not in types
    toks = [1, 17, 42, 99, 200, 3]

    def logits(enabled: bool, backend: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(prompt as one batch: every position's logits, token by token: each token's logits)"""
        monkeypatch.setattr(q80_x8, "ENABLED", enabled)
        # repacked embeddings of models other tests still hold (held here, so no new one takes their id)
        before = [t for t in q80_x8._cache.keys() if t.name == "token_embd.weight"]
        model = Model.load(path)
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2, backend=backend))
        ctx.decode(Batch.from_tokens(toks, pos0=0, logits_all=True))
        batch = np.array(ctx.get_logits())
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2, backend=backend))
        rows = []
        for i, t in enumerate(toks):
            ctx.decode(Batch.from_tokens([t], pos0=i))
            rows.append(ctx.get_logits()[-1].copy())
        if backend is None:
            mine = [
                t
                for t in q80_x8._cache.keys()
                if t.name == "token_embd.weight" and not any(t is b for b in before)
            ]
            assert bool(mine) is enabled
        return batch, np.array(rows)

    rb, r1 = logits(False, "numpy")  # float activations, dequantized weights: the reference
    pb, p1 = logits(False)
    xb, x1 = logits(True)
    assert np.isfinite(xb).all() and np.isfinite(x1).all()
    scale = np.abs(r1).max()
    err_plain = max(np.abs(p1 - r1).max(), np.abs(pb - rb).max())
    err_x8 = max(np.abs(x1 - r1).max(), np.abs(xb - rb).max())
    print(f"largest logit error / largest logit: plain {err_plain / scale:.2e}, x8 {err_x8 / scale:.2e}")
    assert err_plain < 0.01 * scale
    assert err_x8 <= 1.5 * err_plain + 1e-5 * scale
