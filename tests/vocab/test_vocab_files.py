"""llama.cpp's tokenizer tests (test-tokenizer-0): every case of ../shared/vocab/*.gguf.inp/.out.

add_special=False, parse_special=False, as llama.cpp's test; one test per vocabulary file.
"""

from __future__ import annotations

import pytest

from llamapy.vocab import Vocab, VocabType, load_vocab
from tests.util import SHARED, shared_path

SEP = "\n__ggml_vocab_test__\n"
NAMES = sorted(p.name for p in (SHARED / "vocab").glob("*.gguf")) if (SHARED / "vocab").exists() else []
if not NAMES:
    NAMES = ["ggml-vocab-llama-spm.gguf"]  # reported as skipped/failed by shared_path

_CACHE: dict[str, Vocab] = {}


def _vocab(name: str) -> Vocab:
    if name not in _CACHE:
        _CACHE[name] = load_vocab(shared_path("vocab", name))
    return _CACHE[name]


def _cases(name: str) -> list[tuple[str, list[int]]]:
    inp = shared_path("vocab", name + ".inp").read_bytes().decode("utf-8")
    out = shared_path("vocab", name + ".out").read_bytes().decode("utf-8")
    texts = inp.split(SEP)
    if texts and texts[-1] == "":
        texts.pop()
    lines = out.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{name}: {len(texts)} texts but {len(lines)} expected outputs"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


def _mismatches(v: Vocab, name: str) -> list[tuple[str, list[int], list[int]]]:
    """(text, llamapy's ids, llama.cpp's) for each case of ``name`` where they differ."""
    bad = []
    for text, expected in _cases(name):
        got = v.tokenize(text, add_special=False, parse_special=False)
        if got != expected:
            bad.append((text, got, expected))
    return bad


@pytest.mark.parametrize("name", NAMES)
def test_ids_match_llama_cpp(name: str) -> None:
    bad = _mismatches(_vocab(name), name)
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]!r}"


@pytest.mark.parametrize("name", NAMES)
def test_ids_match_llama_cpp_from_the_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same cases with every token and merge looked up in the file's encoded strings (a
    ``StringIndex`` that never builds its dict), as a short prompt's are."""
    from llamapy.gguf import string_index

    monkeypatch.setattr(string_index, "BUDGET", 10**9)
    v = load_vocab(shared_path("vocab", name))
    maps = [m for m in (v.token_to_id, getattr(getattr(v._tokenizer, "bpe", None), "ranks", None))
            if isinstance(m, string_index.StringIndex)]  # fmt: skip
    if v.type is not VocabType.SPM:
        assert maps, "a file's vocabulary is looked up in its bytes"
    bad = _mismatches(v, name)
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]!r}"
    assert all(m.built or m._left < 10**9 for m in maps)  # asked, and answered from the bytes


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_byte_level(name: str) -> None:
    """Byte-level BPE without space clean-up and SPM keep every byte: detokenize(tokenize(s)) == s."""
    v = _vocab(name)
    if not ((v.type is VocabType.BPE and not v.clean_spaces) or v.type is VocabType.SPM):
        pytest.skip(
            "this vocabulary normalizes text (clean_spaces / WordPiece); llama.cpp does not round-trip"
        )
    for text, _ in _cases(name):
        ids = v.tokenize(text, add_special=False, parse_special=False)
        assert v.detokenize(ids) == text, repr(text)
