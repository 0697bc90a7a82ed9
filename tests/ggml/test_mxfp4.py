"""MXFP4 (gpt-oss's expert weights): the codec against an independent scalar transcription of ggml's
reference code (and gguf-py where it has the type), the Numba dequantize kernel bit for bit, the
mat-vec kernel (``mm_mxfp4``) on every bit pattern, the CPU backend's mul_mat / mul_mat_id (mat-vec and
dequantized tiles), and MXFP4 tensors through our GGUF writer and reader."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.ggml import GGMLType as T
from llamapy.ggml import ops
from llamapy.ggml.quants import QuantError, dequantize, dequantize_numpy, dequantize_rows_into, quantize
from llamapy.ggml.types import TRAITS
from tests.ggml.test_backend_ops import check, f32, nmse

RNG = np.random.default_rng(39)
KV = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]  # ggml's kvalues_mxfp4


def _e8m0_half(e: int) -> float:
    """GGML_E8M0_TO_FP32_HALF, as ggml-impl.h computes it from the bits."""
    bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)
    return float(np.array([bits], np.uint32).view(np.float32)[0])


def _ref_dequantize(raw: np.ndarray) -> np.ndarray:
    """dequantize_row_mxfp4, one element at a time."""
    out = []
    for blk in raw.reshape(-1, 17):
        d = np.float32(_e8m0_half(int(blk[0])))
        lo = [np.float32(KV[q & 15]) * d for q in blk[1:]]
        hi = [np.float32(KV[q >> 4]) * d for q in blk[1:]]
        out.extend(lo + hi)
    return np.array(out, np.float32)


def _ref_quantize(x: np.ndarray) -> np.ndarray:
    """quantize_row_mxfp4_ref: e from the block's absmax, each value to the nearest doubled E2M1
    (the first index on ties, as best_index_mxfp4)."""
    out = []
    for blk in x.astype(np.float32).reshape(-1, 32):
        amax = np.float32(np.abs(blk).max())
        e = int(np.floor(np.log2(amax))) - 2 + 127 if amax > 0 else 0
        d = np.float32(_e8m0_half(e))

        def best(v: np.float32, d: np.float32 = d) -> int:
            errs = [abs(np.float32(k) * d - v) for k in KV]
            return int(np.argmin(errs))

        qs = [best(blk[j]) | (best(blk[j + 16]) << 4) for j in range(16)]
        out.append([e & 0xFF, *qs])
    return np.array(out, np.uint8).reshape(-1)


def _random_raw(
    rows: int, blocks: int, rng: np.random.Generator, e_lo: int = 100, e_hi: int = 140
) -> np.ndarray:
    """Random nibbles with exponents in [e_lo, e_hi) (sane magnitudes for products)."""
    raw = rng.integers(0, 256, size=(rows, blocks, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.integers(e_lo, e_hi, size=(rows, blocks))
    return raw.reshape(rows, blocks * 17)


def test_traits_are_ggmls():
    assert int(T.MXFP4) == 39 and TRAITS[T.MXFP4].block_size == 32 and TRAITS[T.MXFP4].type_size == 17


def test_dequantize_matches_the_scalar_reference_on_every_exponent():
    raw = RNG.integers(0, 256, size=(256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)  # every E8M0 byte, subnormal scales (e < 2) and overflow to inf included
    with np.errstate(all="ignore"):
        want = _ref_dequantize(raw)
        got = dequantize_numpy(raw.reshape(1, -1), T.MXFP4).reshape(-1)
    np.testing.assert_array_equal(got, want)


def test_numba_dequantize_kernel_is_bit_identical():
    raw = _random_raw(9, 40, RNG, 0, 256)
    out = np.empty((9, 40 * 32), np.float32)
    with np.errstate(all="ignore"):
        dequantize_rows_into(raw, T.MXFP4, out)
        want = dequantize_numpy(raw, T.MXFP4)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    from llamapy.ggml.quants import has_fast_dequantize

    assert has_fast_dequantize(T.MXFP4)


@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_quantize_matches_ggml_reference(scale):
    x = f32(4, 64, scale=scale)
    x[0, :32] = 0.0  # an all-zero block: e = 0
    x[1, :8] = [0.25, -0.75, 1.25, 5.0, -5.0, 0.5, 7.0, 3.0]  # exact and tie values around a scale of 1
    got = quantize(x, T.MXFP4)
    np.testing.assert_array_equal(got.reshape(-1), _ref_quantize(x))
    # re-quantizing the dequantized values is exact (they are representable)
    back = dequantize(got, T.MXFP4)
    np.testing.assert_array_equal(quantize(back, T.MXFP4), got)
    assert nmse(back, x) < 0.05  # 4 bits and power-of-two scales


def test_codec_matches_gguf_py():
    gguf = pytest.importorskip("gguf")
    qt = gguf.GGMLQuantizationType(39)
    if qt not in gguf.quants._type_traits:
        pytest.skip("this gguf-py has no MXFP4")
    raw = _random_raw(3, 8, RNG)
    np.testing.assert_array_equal(dequantize(raw, T.MXFP4), gguf.quants.dequantize(raw, qt))
    x = f32(3, 256)
    try:
        ref = gguf.quants.quantize(x, qt)
    except NotImplementedError:
        return
    np.testing.assert_array_equal(quantize(x, T.MXFP4), ref)


def test_bad_input_is_a_typed_error():
    with pytest.raises(QuantError, match="17-byte blocks"):
        dequantize(np.zeros((2, 18), np.uint8), T.MXFP4)
    with pytest.raises(QuantError, match="multiple of the block size 32"):
        quantize(np.zeros((2, 40), np.float32), T.MXFP4)
    with pytest.raises(QuantError, match="not finite"):
        quantize(np.full((1, 32), np.inf, np.float32), T.MXFP4)


@pytest.mark.parametrize("m", [1, 3, 8])
def test_matvec_kernel_on_random_bits(m):
    """Every nibble and sign (random bytes) through ``mm_mxfp4``; 13 rows: groups of four plus a rest."""
    from llamapy.ggml.cpu import matmul_kernels as mk

    raw = _random_raw(13, 16, np.random.default_rng(m))
    x = f32(m, 512)
    out = np.zeros((m, 13), np.float32)
    mk.MATVEC["MXFP4"](raw, x, out, mk.F16_TABLE)
    ref = x.astype(np.float64) @ dequantize(raw, T.MXFP4).astype(np.float64).T
    assert nmse(out, ref) < 1e-12


def test_matvec_kernel_decodes_each_value():
    """One-hot activations read single weights back: each of the 16 codes at its position, exactly."""
    from llamapy.ggml.cpu import matmul_kernels as mk

    raw = np.zeros((16, 17), np.uint8)
    raw[:, 0] = 127  # scale 2**-1: the doubled values halve back to E2M1
    for code in range(16):
        raw[code, 1:] = code | (code << 4)
    x = np.eye(32, dtype=np.float32)
    out = np.zeros((32, 16), np.float32)
    mk.MATVEC["MXFP4"](raw, np.ascontiguousarray(x[:8]), out[:8], mk.F16_TABLE)
    mk.MATVEC["MXFP4"](raw, np.ascontiguousarray(x[16:24]), out[16:24], mk.F16_TABLE)
    want = np.array(KV, np.float32) / 2
    for j in (*range(8), *range(16, 24)):
        np.testing.assert_array_equal(out[j], want)


@pytest.mark.parametrize("n_tokens", [1, 3, 17])  # 17: more rows than the mat-vec kernel takes (tiles)
def test_mul_mat_on_the_cpu_backend(n_tokens):
    w = ops.weight("w", T.MXFP4, (13, 256), quantize(f32(13, 256), T.MXFP4))
    x = ops.new_tensor(T.F32, (n_tokens, 256))
    check(ops.mul_mat(w, x), {x: f32(n_tokens, 256)}, tol=1e-10)


@pytest.mark.parametrize("n_tokens", [5, 40])  # 40: the experts get more rows than the mat-vec kernel takes
def test_mul_mat_id_experts_with_biases(n_tokens):
    E, N, K, U = 4, 6, 128, 2
    a = ops.weight("experts", T.MXFP4, (E, N, K), quantize(f32(E, N, K), T.MXFP4))
    b = ops.new_tensor(T.F32, (n_tokens, 1, K))
    bias = ops.new_tensor(T.F32, (E, N))
    ids = ops.new_tensor(T.I32, (n_tokens, U))
    xv, bv = f32(n_tokens, 1, K), f32(E, N)
    iv = RNG.integers(0, E, size=(n_tokens, U)).astype(np.int32)
    y = ops.mul_mat_id(a, b, ids)
    got, _ = check([y, ops.add_id(y, bias, ids)], {b: xv, bias: bv, ids: iv}, 1e-10)
    wf = dequantize(a.data, T.MXFP4).reshape(E, N, K).astype(np.float64)
    want = np.einsum("tunk,tk->tun", wf[iv], xv[:, 0].astype(np.float64))
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], want + bv[iv], rtol=1e-4, atol=1e-4)


def test_gguf_roundtrip(tmp_path):
    from llamapy.gguf import GGUFReader
    from llamapy.gguf.writer import GGUFWriter

    x = f32(6, 64)
    w = GGUFWriter(tmp_path / "m.gguf", arch="gpt-oss")
    w.add_tensor("blk.0.ffn_up_exps.weight", x, ggml_type=T.MXFP4)
    w.write()
    w.close()
    info = GGUFReader(tmp_path / "m.gguf").tensor_index["blk.0.ffn_up_exps.weight"]
    assert info.ggml_type == T.MXFP4 and tuple(info.shape) == (6, 64)
    np.testing.assert_array_equal(np.asarray(info.array()).reshape(-1), quantize(x, T.MXFP4).reshape(-1))


@pytest.mark.parametrize("portable", [False, True], ids=["vfp4", "vfp4_portable"])
def test_nibble_decoders_give_kvalues(portable):
    """Both decoders (vpermps where AVX2 is, the generic bit assembly) on all 256 byte values."""
    from llamapy._numba import njit
    from llamapy.ggml.cpu.mxfp4_kernels import vfp4, vfp4_portable
    from llamapy.ggml.cpu.simd import vhsum, vload, vmul

    @njit
    def decode(raw, eye, hi, use_portable, out):
        for i in range(raw.shape[0] // 8):
            v = vfp4_portable(raw, i * 8, hi) if use_portable else vfp4(raw, i * 8, hi)
            for j in range(8):
                out[i * 8 + j] = vhsum(vmul(v, vload(eye, j * 8)))

    raw = np.arange(256, dtype=np.uint8)
    eye = np.eye(8, dtype=np.float32).reshape(-1)
    kv = np.array(KV, np.float32)
    for hi, want in ((False, kv[raw & 15]), (True, kv[raw >> 4])):
        out = np.zeros(256, np.float32)
        decode(raw, eye, hi, portable, out)
        np.testing.assert_array_equal(out, want)
