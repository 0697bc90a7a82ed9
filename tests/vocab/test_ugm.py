"""UGM (T5 unigram) on a small hand-made vocabulary: Viterbi by score, unknown runs, flags."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.vocab import Vocab, VocabType

TOKENS = ["<pad>", "</s>", "<unk>", "▁", "▁a", "b", "▁ab", "a", "<extra>"]
SCORES = [0.0, 0.0, 0.0, -3.0, -0.5, -0.4, -1.0, -2.0, 0.0]
TYPES = [3, 3, 2, 1, 1, 1, 1, 1, 4]


def _vocab(**kw: object) -> Vocab:
    md = {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": TOKENS,
        "tokenizer.ggml.scores": np.array(SCORES, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(TYPES, dtype=np.int32),
        "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.remove_extra_whitespaces": True,
    }
    md.update(kw)
    return Vocab.from_metadata(md)


def test_defaults() -> None:
    v = _vocab()
    assert v.type is VocabType.UGM
    assert (v.eos, v.unk, v.pad, v.bos) == (1, 2, 0, -1)
    assert not v.add_bos and v.add_eos


@pytest.mark.parametrize(
    "text, ids",
    [
        ("ab", [4, 5, 1]),  # '▁a'+'b' (-0.9) beats '▁ab' (-1.0)
        ("a  b", [4, 3, 5, 1]),  # extra spaces merged: '▁a▁b'
        ("xx", [3, 2, 1]),  # a run of unknown characters is one <unk>
        # user-defined text is split out first; each side is normalized on its own (space prefix)
        ("a<extra>b", [4, 8, 3, 5, 1]),
        ("", [1]),
    ],
)
def test_viterbi(text: str, ids: list[int]) -> None:
    assert _vocab().tokenize(text) == ids


def test_invalid_utf8_is_unknown() -> None:
    assert _vocab().tokenize(b"a\xff", add_special=False) == [4, 2]


def test_detokenize() -> None:
    v = _vocab()
    assert v.detokenize(v.tokenize("ab a"), remove_special=True) == "ab a"
