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
    ],
)
def test_split_examples(name: str, text: str, words: list[str]) -> None:
    assert split(text, compile_regexes(pre_tokenizer(name).regexes)) == words


def test_unknown_pre_tokenizer() -> None:
    with pytest.raises(LlamapyError, match="kimi-k2"):
        pre_tokenizer("kimi-k2")
    assert pre_tokenizer(None).kind == "default"


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
