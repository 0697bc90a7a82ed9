"""Behaviour beyond the reference files: invalid UTF-8, lone surrogates, special-token attributes,
malformed metadata, the piece/detokenize API and the ``llamapy tokenize`` CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamapy.cli import main
from llamapy.errors import LlamapyError
from llamapy.vocab import Vocab, VocabError, load_vocab
from llamapy.vocab.unicode import byte_encode, collapse, decode_utf8
from tests.util import shared_path

_CACHE: dict[Path, Vocab] = {}


def _load(path: Path) -> Vocab:
    if path not in _CACHE:
        _CACHE[path] = load_vocab(path)
    return _CACHE[path]


@pytest.fixture
def smollm2(smollm2_path: Path) -> Vocab:
    return _load(smollm2_path)


@pytest.fixture
def gemma3(gemma3_path: Path) -> Vocab:
    return _load(gemma3_path)


# --- UTF-8 handling (llama.cpp's lenient decoder) ----------------------------------------------------------


@pytest.mark.parametrize(
    "data, text",
    [
        (b"\xe2\x82A", "\ufffd\ufffdA"),  # truncated sequence: one U+FFFD per byte
        (b"\xc0\x80", "\x00"),  # overlong form accepted
        (b"\xed\xa0\x80", "\ud800"),  # surrogate accepted
        (b"\x80\xff", "\ufffd\ufffd"),
        (b"\xf0\x9f\x98", "\ufffd\ufffd\ufffd"),  # truncated at the end
        (b"\xf4\x90\x80\x80", "\ufffd" * 4),  # above U+10FFFF (llama.cpp cannot re-encode it)
        ("é😀".encode(), "é😀"),
    ],
)
def test_decode_utf8_like_llama_cpp(data: bytes, text: str) -> None:
    assert decode_utf8(data) == text


def test_collapse_and_byte_encode() -> None:
    assert collapse("a1 é٣\u00a0!€\u0301") == "a1 \xd2\xd1\x0b!\xd5\xd4"
    assert byte_encode(" é") == "ĠÃ©"


def test_bpe_invalid_utf8_becomes_replacement(smollm2: Vocab) -> None:
    assert smollm2.tokenize(b"a\xffb", add_special=False) == smollm2.tokenize("a\ufffdb", add_special=False)
    # a lone surrogate in a str is taken as its 3-byte form, as llama.cpp would receive it
    ids = smollm2.tokenize("x\ud800y", add_special=False)
    assert ids == smollm2.tokenize(b"x\xed\xa0\x80y", add_special=False)
    assert smollm2.detokenize_bytes(ids) == b"x\xed\xa0\x80y"


def test_spm_invalid_utf8_becomes_byte_tokens(gemma3: Vocab) -> None:
    ids = gemma3.tokenize(b"\xff", add_special=False)
    assert [gemma3.token_text(i) for i in ids] == ["<0xFF>"]
    # llama.cpp cuts symbols by lead byte after escaping spaces: the broken 3-byte sequence swallows
    # the first byte of the '▁' that follows, so that '▁' comes back as its raw bytes, not a space
    ids = gemma3.tokenize(b"ab\xe2\x82 cd", add_special=False)
    assert gemma3.detokenize_bytes(ids) == b"ab\xe2\x82\xe2\x96\x81cd"


def test_spm_long_word_uses_the_kernel_and_agrees(gemma3: Vocab) -> None:
    """A word longer than the Python path's limit goes through the Numba kernel: same ids."""
    from llamapy.vocab.spm import _PY_MAX, spm_python

    tok = gemma3._tokenizer.spm
    word = ("▁" + "tokenizer" * 40)[: _PY_MAX + 50]
    expected = spm_python(word, tok.t2i, tok.scores, tok.byte_ids)
    assert tok.tokenize_kernel(word.encode()) == expected


# --- special tokens ---------------------------------------------------------------------------------------


def test_parse_special_and_pieces(smollm2: Vocab) -> None:
    text = "<|im_start|>user"
    with_special = smollm2.tokenize(text, add_special=False, parse_special=True)
    assert with_special[0] == smollm2.text_to_token("<|im_start|>")
    assert smollm2.tokenize(text, add_special=False, parse_special=False)[0] != with_special[0]
    assert smollm2.detokenize(with_special) == "user"
    assert smollm2.detokenize(with_special, unparse_special=True) == text


def test_rstrip_attribute_phi3() -> None:
    """Phi-3's special tokens strip the whitespace after them (llama.cpp's per-model attributes)."""
    v = load_vocab(shared_path("vocab", "ggml-vocab-phi-3.gguf"))
    a = v.tokenize("<|user|>   hi<|end|>", add_special=False, parse_special=True)
    b = v.tokenize("<|user|>hi<|end|>", add_special=False, parse_special=True)
    assert a == b
    assert a[0] == v.text_to_token("<|user|>")


def test_user_defined_tokens_split_without_parse_special(gemma3: Vocab) -> None:
    nn = gemma3.text_to_token("\n\n")
    assert nn >= 0 and gemma3.is_user_defined(nn)
    assert nn in gemma3.tokenize("a\n\nb", add_special=False, parse_special=False)


def test_out_of_range_token_is_a_clear_error(smollm2: Vocab) -> None:
    with pytest.raises(LlamapyError, match="out of range"):
        smollm2.token_to_piece(smollm2.n_tokens)
    with pytest.raises(LlamapyError, match="out of range"):
        smollm2.detokenize([1, -5])


def test_bos_eos_flags(smollm2: Vocab, gemma3: Vocab) -> None:
    assert not smollm2.add_bos and gemma3.add_bos
    assert gemma3.tokenize("hi")[0] == gemma3.bos
    assert gemma3.detokenize(gemma3.tokenize("hi"), remove_special=True) == "hi"


# --- malformed metadata -----------------------------------------------------------------------------------


def _md(**kw: object) -> dict:
    md: dict = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a", "a", "▁"],
        "tokenizer.ggml.scores": np.zeros(6, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([2, 3, 3, 1, 1, 1], dtype=np.int32),
    }
    md.update(kw)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_spm_vocab_from_metadata() -> None:
    v = Vocab.from_metadata(_md())
    assert v.tokenize("a a", add_special=True) == [1, 3, 3]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"tokenizer.ggml.model": None}, "no tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "nope"}, "unknown or unsupported tokenizer"),
        ({"tokenizer.ggml.tokens": None}, "no tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": np.arange(3)}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.scores": np.zeros(2, dtype=np.float32)}, "2 entries for 6 tokens"),
        ({"tokenizer.ggml.token_type": ["x"] * 6}, "token_type"),
        ({"tokenizer.ggml.bos_token_id": "one"}, "bos_token_id"),
        ({"tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token"),
        ({"tokenizer.ggml.model": "gpt2"}, "merges"),
        (
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "zzz"},
            "unknown or unsupported pre-tokenizer",
        ),
    ],
)
def test_malformed_metadata_raises_vocab_error(kw: dict, match: str) -> None:
    with pytest.raises(LlamapyError, match=match):
        Vocab.from_metadata(_md(**kw))


def test_kimi_k2_vocab_loads_without_merges() -> None:
    """llama.cpp accepts a Kimi-K2 vocabulary with no merges (and no other BPE one): each word is then
    its byte-level pieces."""
    toks = ["a", "b", "ab", "Ġ", "Ġa", "世", "界"]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "kimi-k2", "tokenizer.ggml.tokens": toks,
          "tokenizer.ggml.token_type": np.ones(len(toks), dtype=np.int32)}  # fmt: skip
    v = Vocab.from_metadata(md)
    assert v.tokenize("ab a", add_special=False) == [0, 1, 3, 0]
    with pytest.raises(VocabError, match="merges"):
        Vocab.from_metadata({**md, "tokenizer.ggml.pre": "qwen2"})


def test_vocab_error_is_a_llamapy_error() -> None:
    assert issubclass(VocabError, LlamapyError)


# --- CLI ---------------------------------------------------------------------------------------------------


def test_cli_ids_and_count(smollm2_path: Path, smollm2: Vocab, capsysbinary: pytest.CaptureFixture) -> None:
    assert main(["tokenize", "-m", str(smollm2_path), "-p", "Hello world\\n", "--ids", "--show-count"]) == 0
    out = capsysbinary.readouterr().out.decode()
    ids = smollm2.tokenize("Hello world\n", add_special=False, parse_special=True)
    assert out == f"{ids}\nTotal number of tokens: {len(ids)}\n"


def test_cli_pieces_format(gemma3_path: Path, capsysbinary: pytest.CaptureFixture, tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_bytes(b"Hi<start_of_turn>")
    assert main(["tokenize", "-m", str(gemma3_path), "-f", str(f)]) == 0
    lines = capsysbinary.readouterr().out.split(b"\n")
    assert lines[0] == b"     2 -> '<bos>'"
    assert lines[-2].endswith(b" -> '<start_of_turn>'")
    assert (
        main(["tokenize", "-m", str(gemma3_path), "-f", str(f), "--no-bos", "--no-parse-special", "--ids"])
        == 0
    )
    assert b"2," not in capsysbinary.readouterr().out[:3]


def test_cli_errors(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["tokenize", "-m", str(tmp_path / "missing.gguf"), "-p", "x"]) == 1
    assert "missing.gguf" in capsys.readouterr().err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 3)
    assert main(["tokenize", "-m", str(bad), "-p", "x"]) == 1
    assert "error:" in capsys.readouterr().err
