"""The k-quant mat-vec kernels' own pieces: the Q8_K activation quantizer (bit for bit against the
NumPy codec), non-finite activations, and the generic-IR path of the integer dot products (the one
non-x86 machines take), run in a subprocess that targets a plain x86-64 CPU."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import kquant_kernels as kk
from llamapy.ggml.cpu import matmul_kernels as mk
from llamapy.ggml.quants import dequantize, quantize
from tests.ggml.generic_target import run_on_generic_target

KTYPES = [T.Q4_K, T.Q5_K, T.Q6_K]


def q8_k_rows(x: np.ndarray):
    M, K = x.shape
    xq = np.empty((M, K), np.int8)
    xd = np.empty((M, K // 256), np.float32)
    bs16 = np.empty((M, K // 16), np.int32)
    bs32 = np.empty((M, K // 32), np.int32)
    ok = kk.quantize_rows_q8_k(x, xq, xd, bs16, bs32)
    assert ok.all()
    return xq, xd, bs16, bs32


def activation_cases() -> np.ndarray:
    rng = np.random.default_rng(7)
    rows = [
        rng.standard_normal(1024),
        rng.standard_normal(1024) * 1e-30,  # tiny scales
        np.zeros(1024),  # all-zero blocks
        np.tile([-3.0, 3.0, 1.0, -1.5], 256),  # ties: the first maximum decides the sign
        np.tile([3.0, -3.0, 1.0, 0.5], 256),
        rng.integers(-4, 5, 1024) * 0.5,  # many exact halves: round half to even
        np.r_[np.zeros(256), rng.standard_normal(512) * 1e4, rng.uniform(0, 1, 256)],
    ]
    return np.array(rows, np.float32)


def test_q8_k_activations_match_the_codec():
    x = activation_cases()
    xq, xd, bs16, bs32 = q8_k_rows(x)
    M, K = x.shape
    blocks = quantize(x, T.Q8_K).reshape(M, K // 256, -1)
    np.testing.assert_array_equal(xd, blocks[:, :, :4].copy().view("<f4")[..., 0])
    np.testing.assert_array_equal(xq.reshape(M, K // 256, 256), blocks[:, :, 4:260].view(np.int8))
    np.testing.assert_array_equal(bs16.reshape(M, K // 256, 16), blocks[:, :, 260:].copy().view("<i2"))
    np.testing.assert_array_equal(bs32, bs16.reshape(M, -1, 2).sum(-1))


@pytest.mark.parametrize("t", KTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_kquant_matvec_nonfinite_activations_give_nan(t, bad):
    rng = np.random.default_rng(3)
    raw = quantize(rng.standard_normal((6, 512)).astype(np.float32), t)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    x[1, 300] = bad
    out = np.zeros((2, 6), np.float32)
    mk.MATVEC[t.name](raw, x, out, mk.F16_TABLE)
    assert np.isfinite(out[0]).all()
    assert np.isnan(out[1]).all()


_GENERIC = """
import numpy as np
from llamapy.ggml import GGMLType as T
from llamapy.ggml.cpu import isimd, matmul_kernels as mk
from llamapy.ggml.quants import dequantize, quantize
assert not isimd.HAVE_AVX2
rng = np.random.default_rng(5)
for t in (T.Q4_K, T.Q5_K, T.Q6_K):
    raw = quantize(rng.standard_normal((9, 768)).astype(np.float32), t)
    x = rng.standard_normal((3, 768)).astype(np.float32)
    out = np.zeros((3, 9), np.float32)
    mk.MATVEC[t.name](raw, x, out, mk.F16_TABLE)
    ref = dequantize(quantize(x, T.Q8_K), T.Q8_K).astype(np.float64) @ dequantize(raw, t).T.astype(np.float64)
    err = float(((out - ref) ** 2).sum() / (ref ** 2).sum())
    assert err < 1e-10, (t.name, err)
print("ok")
"""


def test_kquant_matvec_generic_ir_on_a_plain_x86_64_target():
    """NUMBA_CPU_NAME=generic: no AVX2, so ``imadd`` is the generic widen-multiply-add IR."""
    run_on_generic_target(_GENERIC)


def q6_k_integer_case(rows: int, K: int, seed: int):
    """Random Q6_K rows (all 6-bit quants, scales -128..127) with power-of-two ``d`` per row, and
    activations that Q8_K keeps as exact integers (max 127: ``d8`` = -1), so that every partial sum of
    the kernels is exact in float32 and the result must equal the integer dot product bit for bit."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, K // 256, 210), dtype=np.uint8)
    raw[:, :, 192:208] = rng.integers(-128, 128, (rows, K // 256, 16)).astype(np.int8).view(np.uint8)
    d = np.float16(2.0) ** rng.integers(-6, 2, rows).astype(np.float16)
    raw[:, :, 208:210] = np.repeat(d[:, None], K // 256, 1).astype("<f2").view(np.uint8).reshape(rows, -1, 2)
    one = raw.copy()
    one[:, :, 208:210] = np.full((rows, K // 256), 1.0, "<f2").view(np.uint8).reshape(rows, -1, 2)
    w_int = dequantize(one.reshape(rows, -1), T.Q6_K).astype(np.int64).reshape(rows, K)  # sc * (q - 32)
    x = rng.integers(-6, 7, (3, K)).astype(np.float32)
    x[:, ::256] = 127.0  # every block's maximum: iscale -1: xq = -x, d8 = -1, xq * d8 = x
    expect = (d.astype(np.float64)[None, :] * (x.astype(np.int64) @ w_int.T)).astype(np.float32)
    return raw.reshape(rows, -1), x, expect


def test_q6_k_matvec_integer_sums_are_exact():
    """Scales' sign and pairing, the six-bit assembly and the -32 offset (done in integers) checked
    bit for bit on the one-row kernels (both prefetch variants) and the fused experts kernel."""
    from llamapy.ggml.cpu.moe_kernels import MOE

    raw, x, expect = q6_k_integer_case(13, 768, 11)
    assert np.abs(expect).max() < 2**24
    for kern in (kk.mm_q6_k, kk.mm_q6_k_l1):
        out = np.zeros((3, 13), np.float32)
        kern(raw, x, out, mk.F16_TABLE)
        np.testing.assert_array_equal(out, expect)
    w = np.stack([raw, raw[::-1].copy()])  # two experts
    ids = np.array([[1], [0], [1]], np.int64)
    out = np.zeros((3, 13), np.float32)
    assert MOE["Q6_K"](w, x.reshape(3, 1, -1), ids, out, mk.F16_TABLE, 8) == -1
    np.testing.assert_array_equal(out[[1]], expect[[1]])
    np.testing.assert_array_equal(out[[0, 2]], expect[[0, 2]][:, ::-1])
