"""Large string arrays (vocabularies, merges) are read as a compact StringArray (llamapy.gguf.strings):
the same strings as the list the reader gave before, exact copies through the writer, typed errors."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamapy.gguf import GGUFError, GGUFReader, GGUFWriter
from llamapy.gguf.reader import STRING_ARRAY_MIN
from llamapy.gguf.strings import StringArray

# prefixes of one another, empty, non-ASCII, invalid UTF-8 (kept with surrogateescape), a NUL
TRICKY = ["a", "ab", "", "b", "ab", "▁the", "日本", "x\udcff", "nul\x00in", "abc"]


def _write(path: Path, **kv: object) -> Path:
    w = GGUFWriter(path, arch="llama")
    for k, v in kv.items():
        w.add_key_value(k.replace("__", "."), v)
    w.write()
    return path


def test_sequence_behaviour_matches_the_list() -> None:
    a = StringArray.from_strings(TRICKY)
    assert len(a) == len(TRICKY)
    assert list(a) == TRICKY and a.tolist() == TRICKY
    assert [a[i] for i in range(-len(TRICKY), len(TRICKY))] == TRICKY + TRICKY
    assert a[2:5] == TRICKY[2:5] and a[::-3] == TRICKY[::-3]
    assert list(reversed(a)) == TRICKY[::-1]
    assert a == TRICKY and a == StringArray.from_strings(TRICKY) and a != TRICKY[:-1]
    with pytest.raises(IndexError):
        a[len(TRICKY)]
    # first index of a text, only at element boundaries ("b" is inside "ab" and "abc", then alone)
    for t in {*TRICKY, "c", "bc", "a\x00"}:
        assert a.index_of(t) == (TRICKY.index(t) if t in TRICKY else -1), t
        assert (t in a) == (t in TRICKY)
    assert a.byte_lengths().tolist() == [len(t.encode("utf-8", "surrogateescape")) for t in TRICKY]


def test_reader_keeps_large_string_arrays_encoded(tmp_path: Path) -> None:
    big = [f"tok{i}" if i % 7 else "" for i in range(STRING_ARRAY_MIN + 5)] + TRICKY
    small = TRICKY
    p = _write(tmp_path / "s.gguf", tokenizer__ggml__tokens=big, general__tags=small)
    r = GGUFReader(p)
    toks, tags = r.get("tokenizer.ggml.tokens"), r.get("general.tags")
    assert isinstance(toks, StringArray) and toks == big
    assert isinstance(tags, list) and tags == small
    # the writer copies it byte for byte
    q = _write(tmp_path / "copy.gguf", tokenizer__ggml__tokens=toks)
    assert GGUFReader(q).raw_value("tokenizer.ggml.tokens") == r.raw_value("tokenizer.ggml.tokens")
    r.close()  # the array owns its bytes: still readable after the file is closed
    assert toks[-1] == "abc" and toks.index_of("tok8") == 8


def test_truncated_string_array_is_a_typed_error(tmp_path: Path) -> None:
    n = STRING_ARRAY_MIN
    p = _write(tmp_path / "t.gguf", tokenizer__ggml__tokens=[f"t{i}" for i in range(n)])
    data = bytearray(p.read_bytes())
    # the last element claims more bytes than the file has
    last = data.rfind(struct.pack("<Q", len(f"t{n - 1}")) + f"t{n - 1}".encode())
    data[last : last + 8] = struct.pack("<Q", 1 << 40)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=rf"tokenizer.ggml.tokens.*\[{n - 1}\] at offset {last}: string of"):
        GGUFReader(bad)


def test_offsets_must_cover_the_data() -> None:
    import numpy as np

    with pytest.raises(ValueError, match="offsets"):
        StringArray(b"\x01\x00\x00\x00\x00\x00\x00\x00a", np.array([0, 8]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.text(max_size=6)), min_size=0, max_size=300))
def test_tolist_decodes_each_string_as_alone(items: list) -> None:
    """The one-call decode (length fields turned into 0xFF separators) equals decoding each element,
    for any bytes: invalid and truncated UTF-8, 0xFF in the data (the per-string path), empties."""
    sa = StringArray.from_strings(items)
    assert sa.tolist() == [sa[i] for i in range(len(sa))]
