"""The two real models against llama.cpp's outputs in ../shared/reference/*/tokenize.json.

Every record, all four modes (add_special x parse_special), and detokenization of the
add_special=0/parse_special=1 ids with special tokens rendered (``detok``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamapy.vocab import Vocab, load_vocab
from tests.util import shared_path

MODES = [(a, s) for a in (0, 1) for s in (0, 1)]
_CACHE: dict[Path, Vocab] = {}


def _load(path: Path) -> Vocab:
    if path not in _CACHE:
        _CACHE[path] = load_vocab(path)
    return _CACHE[path]


@pytest.fixture(params=["smollm2", "gemma3"])
def model(request: pytest.FixtureRequest) -> tuple[Vocab, list[dict]]:
    if request.param == "smollm2":
        path, ref = request.getfixturevalue("smollm2_path"), "smollm2-135m-q4_1"
    else:
        path, ref = request.getfixturevalue("gemma3_path"), "gemma3-270m-q4_k_m"
    records = json.loads(shared_path("reference", ref, "tokenize.json").read_text(encoding="utf-8"))
    return _load(path), records


def test_tokenize_all_modes(model: tuple[Vocab, list[dict]]) -> None:
    v, records = model
    bad = []
    for r in records:
        for a, s in MODES:
            got = v.tokenize(r["text"], add_special=bool(a), parse_special=bool(s))
            if got != r[f"ids_add{a}_special{s}"]:
                bad.append((r["text"], a, s, got))
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]!r}"


def test_detokenize_matches(model: tuple[Vocab, list[dict]]) -> None:
    v, records = model
    for r in records:
        assert v.detokenize(r["ids_add0_special1"], unparse_special=True) == r["detok"], repr(r["text"])


def test_round_trip_where_llama_cpp_does(model: tuple[Vocab, list[dict]]) -> None:
    """detokenize(tokenize(s)) == s exactly for the strings llama.cpp round-trips."""
    v, records = model
    n = 0
    for r in records:
        if r["detok"] != r["text"]:
            continue
        n += 1
        ids = v.tokenize(r["text"], add_special=False, parse_special=True)
        assert v.detokenize(ids, unparse_special=True) == r["text"]
    assert n > len(records) // 2


def test_special_ids_and_eog(model: tuple[Vocab, list[dict]]) -> None:
    v, _ = model
    assert v.is_eog(v.eos)
    assert not v.is_eog(v.bos) or v.bos == v.eos
    for text in ("<|im_end|>", "<end_of_turn>"):
        tid = v.text_to_token(text)
        if tid >= 0:
            assert v.is_eog(tid) and v.is_control(tid)
            assert v.token_to_piece(tid) == b""
            assert v.token_to_piece(tid, special=True) == text.encode()
