"""Pre-tokenizer regexes (llama.cpp semantics) and the detokenizer's space clean-up."""

from __future__ import annotations

import pytest

from llamapy.errors import LlamapyError
from llamapy.vocab.pretokenize import PRE_TOKENIZERS, compile_regexes, pre_tokenizer, split
from llamapy.vocab.vocab import _clean_spaces

SAMPLE = "Hello world 123456 it's  ok\n\n\r\n日本語 é\u0301 \u00a0x  <sentinel:3>\t😀 3.14 '''"


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_splits_losslessly(name: str) -> None:
    words = split(SAMPLE, compile_regexes(PRE_TOKENIZERS[name].regexes))
    assert "".join(words) == SAMPLE and all(words)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("gpt-2", "Hello  world's 12", ["Hello", " ", " world", "'s", " 12"]),
        ("llama-bpe", "1234567 ab\n\n c", ["123", "456", "7", " ab", "\n\n", " c"]),
        ("qwen2", "x123 HE'LL", ["x", "1", "2", "3", " HE", "'LL"]),
        # non-ASCII letters are one category byte; NBSP counts as whitespace
        ("gpt-2", "é\u00a0ü", ["é", "\u00a0", "ü"]),
        ("smollm", "a12 b", ["a", "1", "2", " b"]),
        ("deepseek-llm", "ab  \n", ["ab", "  ", "\n"]),
        # its letters class takes Cyrillic, and its punctuation runs stay whole (a typo once made the letters
        # regex need a trailing "]": text split only at newlines, ends and digits)
        ("deepseek-llm", "a]} т  ж", ["a", "]}", " т", " ", " ж"]),
        # llama.cpp's own splitters (unicode.cpp): Kimi-K2's keeps Han runs apart and takes letters without
        # their marks; the digit groups cut a run after its first n % 3 digits, then every 3
        (
            "kimi-k2",
            "Hello世界 it's 12345 é\u0301",
            ["Hello", "世界", " it's", " ", "123", "45", " é", "\u0301"],
        ),
        ("tiny_aya", "ab12345 x1234 HelloWorld", ["ab", "12", "345", " x", "1", "234", " HelloWorld"]),
        ("cohere2moe", "1234567", ["1", "234", "567"]),
        ("afmoe", "1234567 中文 hello", ["1", "234", "567", " ", "中文", " hello"]),
    ],
)
def test_split_examples(name: str, text: str, words: list[str]) -> None:
    assert split(text, compile_regexes(pre_tokenizer(name).regexes)) == words


def test_unknown_pre_tokenizer() -> None:
    with pytest.raises(LlamapyError, match="no-such-pre"):
        pre_tokenizer("no-such-pre")
    assert pre_tokenizer(None).kind == "default"


@pytest.mark.parametrize(
    "name, clean",
    [("exaone-moe", True), ("exaone4", True), ("tiny_aya", False), ("cohere2moe", False), ("kimi-k2", False),
     ("afmoe", False), ("deepseek-llm", False)],
)  # fmt: skip
def test_clean_spaces_flag_is_llama_cpps(name: str, clean: bool) -> None:
    """llama.cpp's llama_vocab::load: clean_spaces stays true unless the pre-tokenizer's case sets it."""
    assert pre_tokenizer(name).clean_spaces is clean


@pytest.mark.parametrize(
    "raw, clean",
    [
        (b"Hello , world !", b"Hello, world!"),
        (b"a ' b", b"a'b"),
        (b"a ' ' b", b"a'' b"),  # the skipped space is zeroed in place, so the 2nd quote is not " ' "
        (b"it 's I 'm we 're they 've", b"it's I'm we're they've"),
        (b"don 't I 'd we 'll", b"don 't I 'd we 'll"),
        (b" ?", b"?"),
        (b"", b""),
    ],
)
def test_clean_spaces(raw: bytes, clean: bytes) -> None:
    assert _clean_spaces(raw) == clean
