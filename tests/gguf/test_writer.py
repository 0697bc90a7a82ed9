"""GGUFWriter: round trips with our reader, and gguf-py (test-only oracle) reads the same file."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.ggml.types import TRAITS, GGMLType
from llamapy.gguf import GGUFError, GGUFReader, GGUFValueType, GGUFWriter

VT = GGUFValueType

SCALARS = [
    (VT.UINT8, 255),
    (VT.INT8, -128),
    (VT.UINT16, 65535),
    (VT.INT16, -32768),
    (VT.UINT32, 4294967295),
    (VT.INT32, -2147483648),
    (VT.UINT64, (1 << 64) - 1),
    (VT.INT64, -(1 << 63)),
    (VT.FLOAT32, 1.5),
    (VT.FLOAT64, 1e300),
    (VT.BOOL, True),
    (VT.STRING, "héllo wörld \u2603"),
]
NUMPY_ARRAYS = {
    VT.UINT8: np.array([0, 255], np.uint8),
    VT.INT8: np.array([-128, 127], np.int8),
    VT.UINT16: np.array([0, 65535], np.uint16),
    VT.INT16: np.array([-32768, 1], np.int16),
    VT.UINT32: np.array([1, 4294967295], np.uint32),
    VT.INT32: np.array([-5, 7], np.int32),
    VT.UINT64: np.array([1, (1 << 64) - 1], np.uint64),
    VT.INT64: np.array([-(1 << 63), 3], np.int64),
    VT.FLOAT32: np.array([0.25, -1e30], np.float32),
    VT.FLOAT64: np.array([1e-300, 2.0], np.float64),
    VT.BOOL: np.array([True, False, True]),
}


def _write_everything(path, alignment=32):
    w = GGUFWriter(path, arch="llama", alignment=alignment)
    for vt, v in SCALARS:
        w.add_key_value(f"scalar.{vt.name.lower()}", v, vt)
    for vt, a in NUMPY_ARRAYS.items():
        w.add_key_value(f"array.{vt.name.lower()}", a)  # type inferred from the dtype
    w.add_array("array.string", ["a", "", "ü" * 3, "x y"])
    w.add_array("array.empty_f32", [], sub_type=VT.FLOAT32)
    w.add_array("array.empty_str", [], sub_type=VT.STRING)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    w.add_tensor("i32", np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    w.add_tensor("q8_0", rng.integers(0, 256, (4, 2 * 34), dtype=np.uint8), ggml_type=GGMLType.Q8_0)
    w.add_tensor("q4_k", rng.integers(0, 256, (2, 144), dtype=np.uint8), ggml_type="q4_k")
    w.add_tensor("f64_4d", rng.standard_normal((1, 2, 3, 2)))
    w.write()
    return w


def test_round_trip_all_value_types(tmp_path):
    p = tmp_path / "all.gguf"
    _write_everything(p)
    r = GGUFReader(p)
    assert r.version == 3
    assert r.get("general.architecture") == "llama"
    for vt, v in SCALARS:
        f = r.fields[f"scalar.{vt.name.lower()}"]
        assert f.type == vt
        assert f.value == v
    for vt, a in NUMPY_ARRAYS.items():
        f = r.fields[f"array.{vt.name.lower()}"]
        assert (f.type, f.sub_type) == (VT.ARRAY, vt)
        np.testing.assert_array_equal(f.value, a)
    assert r.get("array.string") == ["a", "", "ü" * 3, "x y"]
    assert r.fields["array.empty_str"].sub_type == VT.STRING and r.get("array.empty_str") == []
    assert r.fields["array.empty_f32"].sub_type == VT.FLOAT32 and len(r.get("array.empty_f32")) == 0


def test_tensors_round_trip_aligned(tmp_path):
    for alignment in (32, 64, 256):
        p = tmp_path / f"t{alignment}.gguf"
        rng = np.random.default_rng(0)
        _write_everything(p, alignment=alignment)
        r = GGUFReader(p, mmap=False)
        assert r.alignment == alignment
        assert r.data_offset % alignment == 0
        np.testing.assert_array_equal(
            r.tensor_index["f32"].array(), rng.standard_normal((3, 5)).astype(np.float32)
        )
        for t in r.tensors:
            assert t.offset % alignment == 0
        assert r.tensor_index["q8_0"].shape == (4, 64)
        assert r.tensor_index["q8_0"].array().shape == (4, 68)
        assert r.tensor_index["q4_k"].shape == (2, 256) and r.tensor_index["q4_k"].ggml_type == GGMLType.Q4_K
        assert r.tensor_index["i32"].ne == (4, 3, 2)
        np.testing.assert_array_equal(r.tensor_index["i32"].array(), np.arange(24).reshape(2, 3, 4))
        assert r.tensor_index["f64_4d"].ggml_type == GGMLType.F64 and r.tensor_index["f64_4d"].shape == (
            1,
            2,
            3,
            2,
        )
        assert r.file_size % alignment == 0


def test_gguf_py_reads_the_same(tmp_path):
    gguf = pytest.importorskip("gguf")
    p = tmp_path / "all.gguf"
    _write_everything(p, alignment=64)
    ours = GGUFReader(p)
    theirs = gguf.GGUFReader(p)
    their_fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(their_fields) == list(ours.fields)
    for k, f in their_fields.items():
        mine = ours.fields[k]
        assert int(f.types[0]) == int(mine.type)
        if mine.sub_type is not None and len(mine.value):  # gguf-py keeps no element type for []
            assert int(f.types[1]) == int(mine.sub_type)
        want = mine.value.tolist() if isinstance(mine.value, np.ndarray) else mine.value
        got = f.contents()
        if mine.type == VT.FLOAT32 or mine.sub_type == VT.FLOAT32:
            np.testing.assert_array_equal(np.float32(got), np.float32(want))
        else:
            assert got == want, k
    assert theirs.alignment == 64
    assert [t.name for t in theirs.tensors] == [t.name for t in ours.tensors]
    for tt in theirs.tensors:
        mine = ours.tensor_index[tt.name]
        assert int(tt.tensor_type) == int(mine.ggml_type)
        assert tuple(int(x) for x in tt.shape) == mine.ne
        assert int(tt.data_offset) == mine.offset
        assert bytes(np.asarray(tt.data).reshape(-1).view(np.uint8)) == bytes(mine.data)


def test_inferred_types(tmp_path):
    p = tmp_path / "inf.gguf"
    w = GGUFWriter(p)
    w.add_metadata(
        {
            "i": 5,
            "big": 1 << 40,
            "huge": 1 << 63,
            "f": 0.5,
            "b": False,
            "s": "x",
            "ints": [1, -2, 3],
            "wide": [1, 1 << 40],
            "mixed": [1, 2.5],
            "bools": [True, False],
            "strs": ["a", "b"],
            "nested": [[1, 2], ["x"]],
            "np_scalar": np.uint16(9),
        }
    )
    w.write()
    f = GGUFReader(p).fields
    assert f["i"].type == VT.INT32 and f["big"].type == VT.INT64 and f["huge"].type == VT.UINT64
    assert f["f"].type == VT.FLOAT32 and f["b"].type == VT.BOOL and f["s"].type == VT.STRING
    assert f["ints"].sub_type == VT.INT32 and f["wide"].sub_type == VT.INT64
    assert (
        f["mixed"].sub_type == VT.FLOAT32
        and f["bools"].sub_type == VT.BOOL
        and f["strs"].sub_type == VT.STRING
    )
    assert f["nested"].sub_type == VT.ARRAY and f["nested"].value[1] == ["x"]
    np.testing.assert_array_equal(f["nested"].value[0], [1, 2])
    assert f["np_scalar"].type == VT.UINT16 and f["np_scalar"].value == 9


def test_float_conversions(tmp_path):
    p = tmp_path / "conv.gguf"
    x = np.array([[1.0, -2.5, 3.140625, 65504.0], [0.0, -0.0, 1e-3, 7.0]], np.float32)
    w = GGUFWriter(p)
    w.add_tensor("h", x, ggml_type=GGMLType.F16)
    w.add_tensor("b", x, ggml_type="bf16")
    w.write()
    r = GGUFReader(p)
    np.testing.assert_array_equal(r.tensor_index["h"].array(), x.astype(np.float16))
    bits = r.tensor_index["b"].data.view(np.uint16).reshape(x.shape)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(back, x, rtol=2**-8)
    assert r.tensor_index["b"].ggml_type == GGMLType.BF16


def test_streaming(tmp_path):
    p = tmp_path / "stream.gguf"
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(3)]
    raw = rng.integers(0, 256, (3, 34), dtype=np.uint8)
    with GGUFWriter(p, arch="test") as w:
        for i, a in enumerate(parts):
            w.add_tensor_info(f"t{i}", a.shape, GGMLType.F32, a.nbytes)
        w.add_tensor_info("q", (3, 32), GGMLType.Q8_0)
        with pytest.raises(GGUFError, match="is next"):
            w.write_tensor_data(parts[1], name="t1")
        for i, a in enumerate(parts):
            w.write_tensor_data(a, name=f"t{i}")
        w.write_tensor_data(raw.tobytes())
        with pytest.raises(GGUFError, match="after the header"):
            w.add_key_value("late", 1)
        with pytest.raises(GGUFError, match="no tensor is waiting"):
            w.write_tensor_data(raw)
    r = GGUFReader(p)
    for i, a in enumerate(parts):
        np.testing.assert_array_equal(r.tensor_index[f"t{i}"].array(), a)
    assert bytes(r.tensor_index["q"].data) == raw.tobytes()


@pytest.mark.parametrize(
    "action, match",
    [
        (lambda w: w.add_key_value("k", 300, VT.UINT8), "out of range for UINT8"),
        (lambda w: w.add_key_value("k", -1, VT.UINT64), "out of range"),
        (lambda w: w.add_key_value("k", 1.5, VT.INT32), "not an integer"),
        (lambda w: w.add_key_value("k", "s", VT.FLOAT32), "not a number"),
        (lambda w: w.add_key_value("k", 1e300), "out of range for float32"),
        (lambda w: w.add_key_value("k", [1.0, 1e39], VT.ARRAY, VT.FLOAT32), "out of range for float32"),
        (lambda w: w.add_key_value("k", 3, VT.STRING), "not a string"),
        (lambda w: w.add_key_value("k", [1, 300], VT.ARRAY, VT.UINT8), "out of range"),
        (lambda w: w.add_key_value("k", []), "empty array"),
        (lambda w: w.add_key_value("k", [1, "a"]), "mixes element types"),
        (lambda w: w.add_key_value("k", object()), "cannot store"),
        (lambda w: w.add_key_value("k", 1 << 64), "does not fit"),
        (lambda w: w.add_key_value("general.alignment", 48, VT.UINT32), "power of two"),
        (lambda w: (w.add_key_value("k", 1), w.add_key_value("k", 2)), "duplicate metadata key"),
        (
            lambda w: (
                w.add_tensor("t", np.zeros(2, np.float32)),
                w.add_tensor("t", np.zeros(2, np.float32)),
            ),
            "duplicate tensor",
        ),
        (
            lambda w: w.add_tensor("t", np.zeros(33, np.uint8), ggml_type=GGMLType.Q8_0),
            "multiple of the Q8_0 block",
        ),
        (lambda w: w.add_tensor("t", np.zeros(34, np.uint8)), "needs ggml_type"),
        (
            lambda w: w.add_tensor("t", np.zeros((2, 34), np.uint8), GGMLType.Q8_0, raw_shape=(3, 32)),
            "takes 102",
        ),
        (lambda w: w.add_tensor("t", np.zeros(4, np.complex64)), "no ggml type"),
        (lambda w: w.add_tensor_info("t", (0, 4), GGMLType.F32), "positive"),
        (lambda w: w.add_tensor_info("n" * 64, (4,), GGMLType.F32), "too long"),
        (lambda w: w.add_tensor_info("t", (1, 1, 1, 1, 1), GGMLType.F32), "1..4"),
        (lambda w: w.add_tensor_info("t", (4, 31), GGMLType.Q4_0), "block size"),
        (lambda w: w.add_tensor_info("t", (4, 32), GGMLType.Q4_0, nbytes=1), "takes 72"),
    ],
)
def test_bad_input_is_refused(tmp_path, action, match):
    w = GGUFWriter(tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=match):
        action(w)


def test_declared_tensor_without_data(tmp_path):
    w = GGUFWriter(tmp_path / "x.gguf")
    w.add_tensor_info("t", (2,), GGMLType.F32)
    with pytest.raises(GGUFError, match="never written"):
        w.write()


def test_quantize_through_ggml_quants(tmp_path):
    try:
        from llamapy.ggml.quants import dequantize, quantize  # noqa: F401
    except ImportError:
        pytest.skip("llamapy.ggml.quants.quantize is not available yet")
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    p = tmp_path / "q.gguf"
    w = GGUFWriter(p)
    w.add_tensor("q", x, ggml_type=GGMLType.Q8_0)
    w.write()
    t = GGUFReader(p).tensor_index["q"]
    assert t.shape == (2, 64) and t.nbytes == 2 * 2 * TRAITS[GGMLType.Q8_0].type_size
    np.testing.assert_allclose(dequantize(t.array(), GGMLType.Q8_0), x, atol=0.05)


_scalar_values = st.one_of(
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.floats(width=32, allow_nan=False),
    st.booleans(),
    st.text(max_size=20),
    st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=1, max_size=8),
    st.lists(st.text(max_size=5), min_size=1, max_size=8),
)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), _scalar_values, max_size=8))
def test_property_metadata_round_trip(tmp_path_factory, meta):
    p = tmp_path_factory.mktemp("prop") / "m.gguf"
    w = GGUFWriter(p)
    w.add_metadata(meta)
    w.write()
    got = GGUFReader(p).metadata
    assert list(got) == list(meta)
    for k, v in meta.items():
        g = got[k]
        if isinstance(g, np.ndarray):
            g = g.tolist()
        assert g == v


def test_rewrite_real_model_byte_identical(smollm2_path, tmp_path):
    """Decoded values re-encoded through add_key_value, tensors streamed: the very same bytes."""
    out = tmp_path / "copy.gguf"
    with GGUFReader(smollm2_path) as r:
        w = GGUFWriter(out)
        for k, f in r.fields.items():
            w.add_key_value(k, f.value, f.type, f.sub_type)
        for t in r.tensors:
            w.add_tensor_info(t.name, t.shape, t.ggml_type, t.nbytes)
        for t in r.tensors:
            w.write_tensor_data(t.data, name=t.name)
        w.close()
    assert out.read_bytes() == open(smollm2_path, "rb").read()


def test_metadata_ints_as_a_given_type(tmp_path):
    """``int_type``: Python ints stored as that type (hyperparameters as UINT32, as llama.cpp's
    converters write them); bools, floats, strings and NumPy scalars keep their inferred types."""
    p = tmp_path / "u32.gguf"
    w = GGUFWriter(p)
    md = {"n": 7, "b": True, "f": 0.25, "s": "x", "np": np.int64(3)}
    w.add_metadata(md, int_type=GGUFValueType.UINT32)
    w.write()
    f = GGUFReader(p).fields
    assert [f[k].type for k in md] == [
        GGUFValueType.UINT32,
        GGUFValueType.BOOL,
        GGUFValueType.FLOAT32,
        GGUFValueType.STRING,
        GGUFValueType.INT64,
    ]
    assert GGUFReader(p).get("n") == 7
