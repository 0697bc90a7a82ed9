"""quantize: bytes equal llama.cpp's (committed reference) and gguf-py's; llama.cpp's error bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llamapy.ggml.quants import QUANTS, QuantError, dequantize, quantize
from llamapy.ggml.types import TRAITS, GGMLType
from tests.util import DATA

gguf = pytest.importorskip("gguf")

REF = np.load(DATA / "quants" / "llama_cpp_quantize.npz")
REF_KEYS = [k for k in REF.files if k not in ("x", "imatrix")]
# the types llama.cpp's tests/test-quantize-fns.cpp bounds, with its limits
BOUNDS = {
    GGMLType.TQ1_0: 0.01,
    GGMLType.TQ2_0: 0.01,
    GGMLType.Q2_K: 0.0075,
    GGMLType.Q3_K: 0.0040,
    GGMLType.IQ3_S: 0.0040,
    GGMLType.IQ3_XXS: 0.0050,
    GGMLType.IQ2_S: 0.0075,
    GGMLType.IQ1_M: 0.025,  # no bound in llama.cpp's test (binary-like 1.75 bpw); loose sanity bound
}
QUANTIZABLE = [t for t, q in QUANTS.items() if q.can_quantize and TRAITS[t].quantized]
GGUF_PY_QUANTIZE = [
    GGMLType.BF16,
    GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.Q5_0,
    GGMLType.Q5_1,
    GGMLType.Q8_0,
    GGMLType.TQ1_0,
    GGMLType.TQ2_0,
    GGMLType.MXFP4,
]


def test_every_float_and_block_type_is_quantizable():
    for t in GGMLType:
        assert QUANTS[t].can_quantize == (TRAITS[t].quantized or TRAITS[t].is_float or t == GGMLType.BF16), (
            t.name
        )
    assert {k.removesuffix("_imatrix") for k in REF_KEYS} == {t.name for t in QUANTIZABLE}


@pytest.mark.parametrize("key", REF_KEYS)
def test_bytes_equal_llama_cpp(key: str):
    t = GGMLType[key.removesuffix("_imatrix")]
    im = REF["imatrix"] if key.endswith("_imatrix") else None
    got = quantize(REF["x"], t, imatrix=im)
    want = REF[key]
    bad = np.flatnonzero((got != want).any(axis=1))
    assert got.shape == want.shape and bad.size == 0, f"{key}: rows {bad.tolist()} differ"


@pytest.mark.parametrize("t", GGUF_PY_QUANTIZE, ids=lambda t: t.name)
def test_bytes_equal_gguf_py(t: GGMLType):
    rng = np.random.default_rng(int(t))
    x = (rng.standard_normal((6, 512)) * rng.uniform(1e-3, 50, (6, 1))).astype(np.float32)
    x[0] = 0
    x[1, 100:] = -0.5
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(t)))
    np.testing.assert_array_equal(quantize(x, t), ref.view(np.uint8))


@settings(max_examples=25, deadline=None)
@given(
    t=st.sampled_from(
        [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.BF16]
    ),
    x=arrays(np.float32, (2, 64), elements=st.floats(-1e4, 1e4, width=32)),
)
def test_bytes_equal_gguf_py_property(t: GGMLType, x: np.ndarray):
    # gguf-py's Q4_0/Q5_0 take the sign of a block of -0.0 into d; llama.cpp does not (next test)
    x = x + np.float32(0)  # -0.0 -> +0.0
    with np.errstate(all="ignore"):
        ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(t)))
    np.testing.assert_array_equal(quantize(x, t), ref.view(np.uint8))


def test_negative_zero_blocks_as_llama_cpp():
    # llama.cpp's _ref quantizers start max at +0.0 and never update it on a block of -0.0: d = 0/-8
    # = -0.0 (half 0x8000) for Q4_0/Q5_0, m = -0.0 for Q4_1/Q5_1 (gguf-py writes +0.0 for Q4_0/Q5_0)
    x = np.full((1, 32), -0.0, np.float32)
    assert quantize(x, GGMLType.Q4_0)[0, :3].tolist() == [0, 128, 136]
    assert quantize(x, GGMLType.Q5_0)[0, :3].tolist() == [0, 128, 255]
    assert quantize(x, GGMLType.Q4_1)[0, :5].tolist() == [0, 0, 0, 128, 0]
    assert quantize(-x, GGMLType.Q4_1)[0, :5].tolist() == [0, 0, 0, 0, 0]
    assert quantize(x, GGMLType.Q8_0)[0, :3].tolist() == [0, 0, 0]


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    # llama.cpp's array_rmse: sqrt(sum of squares) / n
    d = a.astype(np.float64) - b.astype(np.float64)
    return float(np.sqrt(np.sum(d * d)) / d.size)


@pytest.mark.parametrize(
    "t", [t for t in QUANTIZABLE if not QUANTS[t].requires_imatrix], ids=lambda t: t.name
)
def test_round_trip_error_within_llama_cpp_bounds(t: GGMLType):
    n = 32 * 128
    x = (0.1 + 2.0 * np.cos(np.arange(n, dtype=np.float32))).astype(np.float32)  # generate_data(0.0, ...)
    err = _rmse(x, dequantize(quantize(x, t), t))
    assert err < BOUNDS.get(t, 0.002), f"{t.name}: {err}"


@pytest.mark.parametrize(
    "t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.IQ4_XS], ids=lambda t: t.name
)
def test_imatrix_lowers_weighted_error(t: GGMLType):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    im = np.where(np.arange(512) % 8 == 0, 100.0, 0.01).astype(np.float32)
    w = im / im.sum()
    e_plain = np.sum(w * (dequantize(quantize(x, t), t) - x) ** 2)
    e_im = np.sum(w * (dequantize(quantize(x, t, imatrix=im), t) - x) ** 2)
    assert e_im < e_plain


def test_plain_types_round_trip():
    x = np.array([[1.0, -2.5, 3.0e-3, 65504.0]], dtype=np.float32)
    np.testing.assert_array_equal(dequantize(quantize(x, GGMLType.F32), GGMLType.F32), x)
    np.testing.assert_array_equal(dequantize(quantize(x, GGMLType.F16), GGMLType.F16), x.astype(np.float16))
    assert quantize(x, GGMLType.F16).dtype == np.uint8 and quantize(x, GGMLType.F16).shape == (1, 8)


def test_quantize_bad_input():
    with pytest.raises(QuantError, match="multiple of the block size 32"):
        quantize(np.zeros((2, 33), np.float32), GGMLType.Q4_0)
    with pytest.raises(QuantError, match="imatrix has shape"):
        quantize(np.zeros((2, 256), np.float32), GGMLType.Q4_K, imatrix=np.ones(255, np.float32))
    with pytest.raises(QuantError, match="not implemented"):
        quantize(np.zeros((1, 256), np.float32), GGMLType.I32)
    with pytest.raises(QuantError, match="needs importance weights"):
        quantize(np.zeros((1, 256), np.float32), GGMLType.IQ2_XXS)
    with pytest.raises(QuantError, match="unknown ggml type"):
        quantize(np.zeros((1, 32), np.float32), 5)
    with pytest.raises(QuantError, match="scalar"):
        quantize(np.float32(1), GGMLType.Q8_0)
    bad = np.zeros((3, 64), np.float32)
    bad[2, 40] = np.nan
    with pytest.raises(QuantError, match="row 2, column 40 is not finite"):
        quantize(bad, GGMLType.Q8_0)
    # float types keep inf/nan, as in llama.cpp
    assert np.isnan(dequantize(quantize(bad, GGMLType.F16), GGMLType.F16)[2, 40])


@settings(max_examples=40, deadline=None)
@given(
    t=st.sampled_from(sorted(QUANTS, key=int)),
    rows=st.integers(1, 3),
    nblocks=st.integers(1, 3),
    data=st.data(),
)
def test_dequantize_random_bytes_fuzz(t: GGMLType, rows: int, nblocks: int, data):
    """Random bytes of any type: a float32 array of the right shape (or QuantError for a bad length)."""
    tr = TRAITS[t]
    extra = data.draw(st.sampled_from([0, 0, 1]))
    raw = np.frombuffer(
        data.draw(
            st.binary(
                min_size=rows * (nblocks * tr.type_size + extra),
                max_size=rows * (nblocks * tr.type_size + extra),
            )
        ),
        np.uint8,
    ).reshape((rows, -1))
    with np.errstate(all="ignore"):
        if extra and tr.type_size > 1:
            with pytest.raises(QuantError):
                dequantize(raw, t)
            return
        y = dequantize(raw, t)
    assert y.dtype == np.float32 and y.shape == (rows, raw.shape[1] // tr.type_size * tr.block_size)


def test_empty_arrays():
    assert quantize(np.zeros((3, 0), np.float32), GGMLType.Q4_0).shape == (3, 0)
    assert quantize(np.zeros((0, 64), np.float32), GGMLType.Q8_0).shape == (0, 68)
    assert dequantize(np.zeros((0, 144), np.uint8), GGMLType.Q4_K).shape == (0, 256)
    assert dequantize(np.zeros((2, 0), np.uint8), GGMLType.Q6_K).shape == (2, 0)


@pytest.mark.parametrize("t", [t for t in QUANTIZABLE if QUANTS[t].requires_imatrix], ids=lambda t: t.name)
def test_imatrix_only_types_round_trip(t: GGMLType):
    # llama.cpp's test-quantize-fns has no bound for these (no from_float): check they stay close
    n = 32 * 128
    x = (0.1 + 2.0 * np.cos(np.arange(n, dtype=np.float32))).astype(np.float32)
    err = _rmse(x, dequantize(quantize(x, t, imatrix=np.ones(n, np.float32)), t))
    assert err < (0.025 if t == GGMLType.IQ1_S else 0.0075), f"{t.name}: {err}"


def test_f16_table_conversion_is_exact():
    # quantize_file reads F16 input through _rowq.f16_to_f32: every bit pattern as NumPy converts it
    from llamapy.ggml.quants._rowq import f16_to_f32

    bits = np.arange(1 << 16, dtype=np.uint32).astype("<u2").reshape((256, 256))
    got = f16_to_f32(bits.view(np.uint8))
    want = bits.view(np.float16).astype(np.float32)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
