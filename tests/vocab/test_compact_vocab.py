"""The vocabulary kept compact (token texts as the file's StringArray, SPM's text -> id map as the
kernel's hash table) gives what the list-and-dict vocabulary gave: ids, texts, pieces, special tokens."""

from __future__ import annotations

import numpy as np
import pytest

from llamapy.gguf import GGUFReader
from llamapy.gguf.strings import StringArray
from llamapy.vocab import Vocab
from llamapy.vocab.spm import TokenIndex

TEXTS = ["Hello world", " leading and  double  spaces\n\nnewlines", "日本語 und Ümlaute ✓", "<start_of_turn>user\nhi",
         "x" * 600, "tab\tend", ""]  # fmt: skip


def test_token_index_is_a_mapping_where_a_later_id_wins() -> None:
    toks = ["a", "ab", "b", "ab", "日本", "x\udcff"]
    for seq in (toks, StringArray.from_strings(toks)):
        ix = TokenIndex(seq)
        assert ix.get("ab") == 3 and ix["a"] == 0 and ix.get("日本") == 4 and ix.get("x\udcff") == 5
        assert ix.get("abc") is None and ix.get("abc", -1) == -1 and "c" not in ix and "b" in ix
        with pytest.raises(KeyError):
            ix["zz"]
        assert len(ix) == 5 and sorted(ix) == sorted(set(toks))


@pytest.fixture(scope="module", params=["gemma3_path", "smollm2_path"])
def vocabs(request) -> tuple[Vocab, Vocab]:
    md = GGUFReader(request.getfixturevalue(request.param)).metadata
    assert isinstance(md["tokenizer.ggml.tokens"], StringArray)
    as_lists = {k: (v.tolist() if isinstance(v, StringArray) else v) for k, v in md.items()}
    return Vocab.from_metadata(md), Vocab.from_metadata(as_lists)


def test_compact_and_list_vocabularies_agree(vocabs: tuple[Vocab, Vocab]) -> None:
    compact, plain = vocabs
    assert isinstance(compact.tokens, StringArray) and isinstance(plain.tokens, list)
    assert compact.n_tokens == plain.n_tokens and compact.tokens == plain.tokens
    assert np.array_equal(compact.attrs, plain.attrs) and np.array_equal(compact.scores, plain.scores)
    for attr in ("bos", "eos", "eot", "nl", "pad", "unk", "special_ids", "eog_ids", "max_token_len"):
        assert getattr(compact, attr) == getattr(plain, attr), attr
    for text in TEXTS:
        for special in (False, True):
            ids = compact.tokenize(text, add_special=True, parse_special=special)
            assert ids == plain.tokenize(text, add_special=True, parse_special=special), (text, special)
            assert compact.detokenize(ids) == plain.detokenize(ids)
    rng = np.random.default_rng(0)
    for t in rng.integers(0, compact.n_tokens, 300).tolist():
        assert compact.token_to_piece(t, special=True) == plain.token_to_piece(t, special=True)
        assert compact.text_to_token(compact.token_text(t)) == plain.text_to_token(plain.token_text(t))
