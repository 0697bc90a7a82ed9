"""Properties over arbitrary text (hypothesis): round trips, and the two SPM paths agreeing."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamapy.vocab import Vocab, load_vocab
from tests.util import shared_path

_CACHE: dict[Path, Vocab] = {}
PIECES = [*"ab xy\n\t.,'!1é€😀\u00a0<|>", "<|im_end|>", "\r\n", "  "]
TEXT = st.lists(st.sampled_from(PIECES), max_size=20).map("".join)
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _load(path: Path) -> Vocab:
    if path not in _CACHE:
        _CACHE[path] = load_vocab(path)
    return _CACHE[path]


@SETTINGS
@given(text=TEXT)
def test_byte_level_bpe_round_trip(smollm2_path: Path, text: str) -> None:
    v = _load(smollm2_path)  # SmolLM2: byte-level BPE without space clean-up
    for parse_special in (False, True):
        ids = v.tokenize(text, add_special=False, parse_special=parse_special)
        assert v.detokenize(ids, unparse_special=True) == text


@SETTINGS
@given(text=TEXT)
def test_spm_round_trip(text: str) -> None:
    v = _load(shared_path("vocab", "ggml-vocab-llama-spm.gguf"))
    ids = v.tokenize(text, add_special=False)
    assert v.detokenize(ids) == text


@SETTINGS
@given(text=st.lists(st.sampled_from([*"abcdefgh ▁é😀", "the", "ing", "▁▁"]), max_size=40).map("".join))
def test_spm_python_and_kernel_agree(text: str) -> None:
    from llamapy.vocab.spm import spm_python

    v = _load(shared_path("vocab", "ggml-vocab-llama-spm.gguf"))
    tok = v._tokenizer.spm
    assert tok.tokenize_kernel(text.encode()) == spm_python(text, tok.t2i, tok.scores, tok.byte_ids)


def _simple_merges(word: str, ranks: dict[str, int]) -> list[str]:
    symbols = list(word)
    while True:
        pairs = [
            (ranks.get(a + " " + b), i)
            for i, (a, b) in enumerate(zip(symbols[:-1], symbols[1:], strict=True))
        ]
        pairs = [p for p in pairs if p[0] is not None]
        if not pairs:
            return symbols
        _, i = min(pairs)
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


@SETTINGS
@given(word=st.text(st.sampled_from("abeinrstĠ"), max_size=80))
def test_bpe_heap_merge_equals_lowest_rank_leftmost(smollm2_path: Path, word: str) -> None:
    bpe = _load(smollm2_path)._tokenizer.bpe
    if word:
        assert bpe._merge_heap(word) == _simple_merges(word, bpe.ranks)


def test_long_words_are_not_quadratic(smollm2_path: Path, gemma3_path: Path) -> None:
    for path in (smollm2_path, gemma3_path):
        v = _load(path)
        text = "ab" * 50_000
        ids = v.tokenize(text, add_special=False)
        assert v.detokenize(ids) == text


@SETTINGS
@given(text=st.lists(st.sampled_from([*"ab é▁😀<>/", " the", "ing", "  ", ">▁</"]), max_size=30).map("".join))
def test_spm_word_cache_equals_whole_fragment(gemma3_path: Path, text: str) -> None:
    """Cutting a fragment before each '▁' run (cached words) gives llama.cpp's whole-fragment result."""
    tok = _load(gemma3_path)._tokenizer.spm
    data = text.encode()
    assert tok.tokenize(data) == tok.tokenize_kernel(data)
