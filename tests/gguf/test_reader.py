"""GGUFReader: valid files (v2/v3, every value type, mmap and in-memory), the real models against gguf-py,
and one hand-built bad file per validation rule (llama.cpp's tests/test-gguf.cpp and its GGUF CVEs as the
checklist), each checked for its GGUFError message and byte offset."""

from __future__ import annotations

import re
import struct
import time

import numpy as np
import pytest

from llamapy.ggml.types import GGMLType
from llamapy.gguf import GGUFError, GGUFReader, GGUFValueType
from llamapy.gguf.constants import MAX_NESTED_VALUES
from tests.gguf.craft import (
    ARR,
    BOOL,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    STR,
    U8,
    U16,
    U32,
    U64,
    build,
    kv,
    kv_str,
    kv_u32,
    s,
    tinfo,
)

Q8_0, Q4_K, F32T, I8T, I64T = 8, 12, 0, 24, 27


def _read(tmp_path, lay_or_bytes, mmap=True):
    data = lay_or_bytes if isinstance(lay_or_bytes, bytes) else lay_or_bytes.data
    p = tmp_path / "x.gguf"
    p.write_bytes(data)
    return GGUFReader(p, mmap=mmap)


def _fails(tmp_path, lay, pattern, offset=None):
    with pytest.raises(GGUFError) as ei:
        _read(tmp_path, lay)
    msg = str(ei.value)
    assert re.search(pattern, msg), msg
    if offset is not None:
        assert re.search(rf"\boffset {offset}\b", msg), msg
    assert "x.gguf" in msg  # names the file
    return msg


# -- valid files -------------------------------------------------------------------------------


def _all_types_file(version=3):
    kvs = [
        kv("u8", U8, b"\xff"),
        kv("i8", I8, struct.pack("<b", -3)),
        kv("u16", U16, struct.pack("<H", 65535)),
        kv("i16", I16, struct.pack("<h", -300)),
        kv_u32("u32", 4000000000),
        kv("i32", I32, struct.pack("<i", -7)),
        kv("f32", F32, struct.pack("<f", 0.5)),
        kv("bool", BOOL, b"\x01"),
        kv_str("str", "héllo"),
        kv("u64", U64, struct.pack("<Q", 1 << 63)),
        kv("i64", I64, struct.pack("<q", -(1 << 62))),
        kv("f64", F64, struct.pack("<d", 1e300)),
        kv("arr_f32", ARR, struct.pack("<IQ", F32, 3) + struct.pack("<3f", 1, 2, 3)),
        kv("arr_str", ARR, struct.pack("<IQ", STR, 2) + s("ab") + s("")),
        kv(
            "arr_arr",
            ARR,
            struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", I16, 2) + struct.pack("<2h", 1, -1),
        ),
    ]
    data = np.arange(8, dtype=np.float32).tobytes() + b"\0" * 32 + bytes(range(34))
    tensors = [tinfo("a", [4, 2], F32T, 0), tinfo("q", [32], Q8_0, 64)]
    return build(kvs, tensors, data, version=version)


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("mmap", [True, False])
def test_valid_file(tmp_path, version, mmap):
    lay = _all_types_file(version)
    r = _read(tmp_path, lay, mmap=mmap)
    assert r.version == version
    m = r.metadata
    assert (m["u8"], m["i8"], m["u16"], m["i16"], m["u32"], m["i32"]) == (
        255,
        -3,
        65535,
        -300,
        4000000000,
        -7,
    )
    assert (m["f32"], m["bool"], m["str"], m["u64"], m["i64"], m["f64"]) == (
        0.5,
        True,
        "héllo",
        1 << 63,
        -(1 << 62),
        1e300,
    )
    assert r.fields["u8"].type == GGUFValueType.UINT8 and r.fields["f64"].type == GGUFValueType.FLOAT64
    np.testing.assert_array_equal(m["arr_f32"], [1, 2, 3])
    assert m["arr_f32"].dtype == np.float32 and r.fields["arr_f32"].sub_type == GGUFValueType.FLOAT32
    assert m["arr_str"] == ["ab", ""]
    np.testing.assert_array_equal(m["arr_arr"][0], [1, -1])
    assert r.get("missing", 42) == 42
    assert r.data_offset == lay.data_offset and r.alignment == 32
    a = r.tensor_index["a"]
    assert (
        a.ne == (4, 2) and a.shape == (2, 4) and a.ggml_type == GGMLType.F32 and a.offset == lay.data_offset
    )
    np.testing.assert_array_equal(a.array(), np.arange(8, dtype=np.float32).reshape(2, 4))
    q = r.tensor_index["q"]
    assert q.nbytes == 34 and bytes(q.data) == bytes(range(34)) and q.array().shape == (34,)
    assert r.raw_value("str") == s("héllo")
    if mmap:  # zero-copy views over the map
        assert not a.data.flags.owndata and not a.data.flags.writeable


def test_real_model_matches_gguf_py(smollm2_path):
    gguf = pytest.importorskip("gguf")  # gguf-py takes ~15 s on Gemma's vocabulary, so SmolLM2 only
    for p in (smollm2_path,):
        ours, theirs = GGUFReader(p), gguf.GGUFReader(p)
        fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert list(fields) == list(ours.fields)
        for k, f in fields.items():
            mine = ours.fields[k]
            assert int(f.types[0]) == int(mine.type), k
            got = f.contents()
            want = mine.value.tolist() if isinstance(mine.value, np.ndarray) else mine.value
            if mine.type == GGUFValueType.FLOAT32 or mine.sub_type == GGUFValueType.FLOAT32:
                np.testing.assert_array_equal(np.float32(got), np.float32(want))
            else:
                assert got == want, k
        assert ours.data_offset == theirs.data_offset and ours.alignment == theirs.alignment
        assert len(ours.tensors) == len(theirs.tensors)
        for tt, mine in zip(theirs.tensors, ours.tensors, strict=True):
            assert (tt.name, int(tt.tensor_type), int(tt.data_offset), int(tt.n_bytes)) == (
                mine.name,
                int(mine.ggml_type),
                mine.offset,
                mine.nbytes,
            )
            assert tuple(int(x) for x in tt.shape) == mine.ne
        t = ours.tensors[-1]
        assert np.shares_memory(t.data, ours.tensors[-1].array())


def test_gemma3_reads(gemma3_path):
    r = GGUFReader(gemma3_path)
    assert r.get("general.architecture") == "gemma3" and len(r.tensors) == 236
    assert {t.ggml_type.name for t in r.tensors} == {"Q4_K", "Q5_0", "Q6_K", "Q8_0", "F32"}
    assert len(r.get("tokenizer.ggml.tokens")) == len(r.get("tokenizer.ggml.scores")) == 262144
    end = max(t.offset + t.nbytes for t in r.tensors)
    assert end <= r.file_size < end + r.alignment


# -- header ------------------------------------------------------------------------------------


def test_too_short(tmp_path):
    _fails(tmp_path, b"GGUF\3\0\0\0", "too short for a GGUF header")


def test_bad_magic(tmp_path):
    _fails(tmp_path, build(magic=b"FUGG"), r"bad magic b'FUGG'.*not a GGUF file", 0)


@pytest.mark.parametrize(
    "version, pattern",
    [(0, "unsupported GGUF version 0"), (1, "version 1 .* no longer supported"), (4, "unsupported GGUF version 4"),
     (0x03000000, "looks big-endian")],
)  # fmt: skip
def test_bad_version(tmp_path, version, pattern):
    _fails(tmp_path, build(version=version), pattern, 4)


def test_counts_that_cannot_fit(tmp_path):
    _fails(tmp_path, build(n_tensors=(1 << 64) - 1), "tensor count 18446744073709551615 .*cannot fit", 8)
    _fails(tmp_path, build(n_kv=(1 << 64) - 1), "metadata count .*cannot fit", 16)
    _fails(tmp_path, build(n_kv=1000), "metadata count 1000 at offset 16 cannot fit")
    _fails(tmp_path, build(n_tensors=3), "tensor count 3 at offset 8 cannot fit")
    # a count that fits the size bound but whose records are missing
    lay = build([kv_u32("a", 1), kv_u32("b", 2)], n_kv=3)
    _fails(
        tmp_path, lay, "length of key of metadata #2 at offset 58: needs 8 bytes, only 0 left", len(lay.data)
    )


# -- metadata ----------------------------------------------------------------------------------


def test_key_length_overflow(tmp_path):  # CVE-2024-25664-style: huge string length
    lay = build([struct.pack("<Q", (1 << 64) - 1) + b"k" * 20])
    _fails(tmp_path, lay, "key of metadata #0 .*string length 18446744073709551615 is above the limit", 24)


def test_key_past_end(tmp_path):
    lay = build([struct.pack("<Q", 100) + b"k" * 20])
    _fails(tmp_path, lay, r"key of metadata #0 at offset 32: needs 100 bytes, only 20 left")


def test_empty_key(tmp_path):
    lay = build([kv_u32("", 1)])
    _fails(tmp_path, lay, "metadata #0 at offset 24 has an empty key")


@pytest.mark.parametrize("vtype", [13, 0xFFFFFFFF])
def test_unknown_value_type(tmp_path, vtype):
    lay = build([kv("k", vtype, b"\0" * 8)])
    _fails(tmp_path, lay, f"value of 'k' at offset {24 + 9 + 4}: unknown value type {vtype}")


def test_unknown_array_element_type(tmp_path):
    lay = build([kv("k", ARR, struct.pack("<IQ", 13, 1) + b"\0" * 8)])
    _fails(tmp_path, lay, "unknown array element type 13", 24 + 13)


def test_array_lengths(tmp_path):
    start = 24 + 13
    lay = build([kv("k", ARR, struct.pack("<IQ", U32, 1 << 40))])
    _fails(tmp_path, lay, "array length 1099511627776 is above the limit", start)
    lay = build([kv("k", ARR, struct.pack("<IQ", U64, 1000) + b"\0" * 16)])
    _fails(tmp_path, lay, r"value of 'k' at offset \d+: needs 8000 bytes, only 16 left")
    # CVE-2024-25666-style: n * element size wraps in 64 bits
    lay = build([kv("k", ARR, struct.pack("<IQ", U64, (1 << 61) + 1) + b"\0" * 16)])
    _fails(tmp_path, lay, "above the limit", start)
    lay = build([kv("k", ARR, struct.pack("<IQ", STR, 100) + s("ok"))])
    _fails(tmp_path, lay, r"needs 800 bytes")
    lay = build([kv("k", ARR, struct.pack("<IQ", STR, 2) + s("ok") + struct.pack("<Q", 1 << 50) + b"\0" * 8)])
    _fails(
        tmp_path, lay, r"value of 'k'\[1\] at offset \d+: string of 1125899906842624 bytes runs past the end"
    )


def test_string_value_past_end(tmp_path):
    lay = build([kv("k", STR, struct.pack("<Q", 64) + b"abc")])
    _fails(tmp_path, lay, r"value of 'k' at offset 45: needs 64 bytes, only 3 left")


def test_arrays_nested_too_deeply(tmp_path):
    payload = struct.pack("<IQ", ARR, 1) * 6 + struct.pack("<IQ", U8, 0)
    _fails(tmp_path, build([kv("k", ARR, payload)]), "arrays nested too deeply")


def test_millions_of_empty_sub_arrays_fail_at_once(tmp_path):
    """Issue 33 §2.12: 4M empty sub-arrays took 42 s and 900 MB; now the array's length is refused
    before any element is read."""
    n = 4_000_000
    lay = build(
        [kv_u32("a", 1), kv("evil.nested", ARR, struct.pack("<IQ", ARR, n) + struct.pack("<IQ", STR, 0) * n)]
    )
    t0 = time.perf_counter()
    _fails(tmp_path, lay, rf"value of 'evil.nested' at offset \d+: nested arrays hold more than {MAX_NESTED_VALUES} "
           rf"values in all \(this array has {n}\)")  # fmt: skip
    assert time.perf_counter() - t0 < 5


def test_nested_values_are_bounded_per_file(tmp_path):
    """Many keys each under the bound, or small string arrays inside arrays, share one budget."""
    per_key = MAX_NESTED_VALUES // 4
    sub = struct.pack("<IQ", U8, 0)
    kvs = [kv(f"k{i}", ARR, struct.pack("<IQ", ARR, per_key) + sub * per_key) for i in range(4)]
    assert len(_read(tmp_path, build(kvs)).fields) == 4  # exactly the bound: read
    _fails(
        tmp_path,
        build([*kvs, kv("k4", ARR, struct.pack("<IQ", ARR, 1) + sub)]),
        "value of 'k4'.*nested arrays",
    )
    strings = struct.pack("<IQ", STR, 1000) + s("x") * 1000
    many = [
        kv(f"s{i}", ARR, struct.pack("<IQ", ARR, 1) + strings) for i in range(MAX_NESTED_VALUES // 1000 + 1)
    ]
    _fails(tmp_path, build(many), r"value of 's\d+'\[0\].*nested arrays hold more than")
    # top-level arrays are not nested values: a vocabulary of any size is read
    assert (
        len(
            _read(tmp_path, build([kv("v", ARR, struct.pack("<IQ", STR, 100_000) + s("t") * 100_000)])).get(
                "v"
            )
        )
        == 100_000
    )


def test_duplicate_key(tmp_path):
    lay = build([kv_u32("a", 1), kv_u32("b", 2), kv_u32("a", 3)])
    _fails(tmp_path, lay, "duplicate metadata key 'a'", lay.kv_offsets[2])


@pytest.mark.parametrize(
    "record, pattern",
    [
        (kv_u32("general.alignment", 0), "general.alignment = 0 .*not a power of two"),
        (kv_u32("general.alignment", 13), "general.alignment = 13 .*not a power of two"),
        (kv_u32("general.alignment", 1 << 31), "not a power of two in 1..65536"),  # alignment overflow CVE
        (kv("general.alignment", I32, struct.pack("<i", 32)), "has type INT32, expected UINT32"),
    ],
)
def test_bad_alignment(tmp_path, record, pattern):
    lay = build([kv_str("x", "y"), record])
    _fails(tmp_path, lay, pattern, lay.kv_offsets[1])


# -- tensor infos ------------------------------------------------------------------------------


def _one_tensor(ti: bytes, data: bytes = b"\0" * 64, **kw):
    return build([kv_str("general.architecture", "t")], [ti], data, **kw)


def test_tensor_name_too_long_or_empty(tmp_path):
    lay = _one_tensor(tinfo("n" * 64, [4], F32T, 0))
    _fails(tmp_path, lay, "name of 64 bytes is too long", lay.tensor_offsets[0])
    lay = _one_tensor(tinfo("n" * 63, [4], F32T, 0))
    assert _read(tmp_path, lay).tensors[0].name == "n" * 63
    lay = _one_tensor(tinfo("", [4], F32T, 0))
    _fails(tmp_path, lay, "empty name", lay.tensor_offsets[0])


def test_tensor_name_past_end(tmp_path):
    lay = build([], [struct.pack("<Q", 1 << 20) + b"\0" * 40])
    _fails(tmp_path, lay, "name of tensor #0 at offset 32: needs 1048576 bytes, only \\d+ left")
    lay = build([], [struct.pack("<Q", 1 << 40) + b"\0" * 40])
    _fails(tmp_path, lay, "name of tensor #0 .*string length 1099511627776 is above the limit", 24)


def test_duplicate_tensor_name(tmp_path):
    lay = build([], [tinfo("t", [4], F32T, 0), tinfo("t", [4], F32T, 32)], b"\0" * 64)
    _fails(tmp_path, lay, "duplicate tensor name 't'", lay.tensor_offsets[1])


@pytest.mark.parametrize("n_dims", [0, 5, 0xFFFFFFFF])
def test_bad_n_dims(tmp_path, n_dims):
    lay = _one_tensor(tinfo("t", [4], F32T, 0, n_dims=n_dims))
    _fails(tmp_path, lay, f"n_dims {n_dims} outside 1..4", lay.tensor_offsets[0])


@pytest.mark.parametrize("dim", [0, -1, -(1 << 63)])
def test_bad_dimension(tmp_path, dim):
    lay = _one_tensor(tinfo("t", [4, dim], F32T, 0))
    _fails(tmp_path, lay, f"dimension {dim} is not positive", lay.tensor_offsets[0])


def test_element_count_overflow(tmp_path):  # HANDCRAFTED_TENSORS_NE_TOO_BIG
    lay = _one_tensor(tinfo("t", [1 << 32, 1 << 32], F32T, 0))
    _fails(tmp_path, lay, "element count overflows int64", lay.tensor_offsets[0])


def test_byte_size_too_big(tmp_path):  # HANDCRAFTED_TENSORS_NBYTES_TOO_BIG: fits int64 elements, not bytes
    lay = _one_tensor(tinfo("t", [1 << 61, 2], I64T, 0))
    _fails(tmp_path, lay, "36893488147419103232 bytes of data cannot fit", lay.tensor_offsets[0])


def test_mem_size_overflow(tmp_path):  # HANDCRAFTED_DATA_MEM_SIZE_OVERFLOW
    n = 0x7FFFFFFFFFFFFFC0
    lay = build([], [tinfo("a", [n], I8T, 0), tinfo("b", [n], I8T, n)], b"\0" * 64)
    _fails(tmp_path, lay, "cannot fit in the file", lay.tensor_offsets[0])


@pytest.mark.parametrize(
    "ttype, pattern",
    [(4, "type Q4_2 \\(4\\) was removed"), (5, "Q4_3"), (31, "Q4_0_4_4"), (36, "IQ4_NL_4_4"),
     (40, "unknown tensor type 40"), (1 << 31, "unknown tensor type")],
)  # fmt: skip
def test_bad_tensor_type(tmp_path, ttype, pattern):
    lay = _one_tensor(tinfo("t", [32], ttype, 0))
    _fails(tmp_path, lay, pattern, lay.tensor_offsets[0])


def test_row_not_multiple_of_block(tmp_path):
    lay = _one_tensor(tinfo("t", [33, 2], Q8_0, 0))
    _fails(
        tmp_path, lay, "row of 33 elements is not a multiple of the Q8_0 block size 32", lay.tensor_offsets[0]
    )


def test_tensor_infos_truncated(tmp_path):
    lay = _one_tensor(tinfo("t", [4], F32T, 0))
    cut = lay.data[: lay.tensor_offsets[0] + 8 + 1 + 4 + 4]  # inside the dimension
    _fails(tmp_path, cut, r"dimension of tensor 't' at offset \d+: needs 8 bytes")


# -- data section ------------------------------------------------------------------------------


def test_misaligned_offset(tmp_path):  # HANDCRAFTED_TENSORS_BAD_OFFSET / INCONSISTENT_ALIGN
    lay = _one_tensor(tinfo("t", [4], F32T, 16))
    _fails(tmp_path, lay, "data offset 16 is not a multiple of the alignment 32", lay.tensor_offsets[0])
    lay = build([kv_u32("general.alignment", 64)], [tinfo("t", [4], F32T, 32)], b"\0" * 128, alignment=64)
    _fails(tmp_path, lay, "data offset 32 is not a multiple of the alignment 64", lay.tensor_offsets[0])


def test_data_outside_file(tmp_path):  # HANDCRAFTED_DATA_NOT_ENOUGH_DATA
    lay = _one_tensor(tinfo("t", [32], F32T, 0), data=b"\0" * 100)
    msg = _fails(tmp_path, lay, r"tensor 't' \(info at offset \d+\): data \[\d+, \d+\) runs past the end")
    assert f"[{lay.data_offset}, {lay.data_offset + 128})" in msg
    lay = _one_tensor(tinfo("t", [4], F32T, 1 << 63))
    _fails(tmp_path, lay, "runs past the end")


def test_overlapping_tensors(tmp_path):
    lay = build([], [tinfo("a", [16], F32T, 0), tinfo("b", [4], F32T, 32)], b"\0" * 64)
    _fails(tmp_path, lay, rf"tensor 'b' data at offset {lay.data_offset + 32} overlaps tensor 'a'")


def test_every_truncation_fails(tmp_path):
    lay = _all_types_file()
    end = lay.data_offset + 64 + 34  # the last byte of tensor data
    for n in range(0, end, 3):
        with pytest.raises(GGUFError):
            _read(tmp_path, lay.data[:n])


def test_missing_and_directory(tmp_path):
    with pytest.raises(GGUFError, match="cannot read"):
        GGUFReader(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="cannot read"):
        GGUFReader(tmp_path)
