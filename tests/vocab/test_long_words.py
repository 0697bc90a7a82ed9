"""Degenerate pre-tokenizer words (issue 33 §2.6): long words go through the Numba merge kernels and give
exactly the tokens of the reference loops; ``max_tokens`` stops early and is exact about when."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llamapy.vocab.bpe as bpe_mod
from llamapy.vocab import TooManyTokensError, Vocab, load_vocab
from llamapy.vocab.spm import spm_python
from tests.util import shared_path

_CACHE: dict[str, Vocab] = {}
BPE_VOCABS = ["ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-gemma-4.gguf"]
CHARS = [*"xyab01é€😀-_.!\n\t", "\u00a0", "\u0301"]
# long runs of one character, mixed with short random stretches
RUNS = st.lists(st.tuples(st.sampled_from(CHARS), st.integers(1, 400)), min_size=1, max_size=8).map(
    lambda runs: "".join(c * n for c, n in runs)
)
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _load(name: str) -> Vocab:
    if name not in _CACHE:
        _CACHE[name] = load_vocab(shared_path("vocab", name))
    return _CACHE[name]


def _reference(v: Vocab, text: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tokens with every word merged by the Python loops (the kernel switched off, no cache)."""
    with monkeypatch.context() as m:
        m.setattr(bpe_mod, "_KERNEL", 1 << 60)
        tok = v._tokenizer.bpe
        saved = dict(tok._cache)
        tok._cache.clear()
        try:
            return v.tokenize(text, add_special=False)
        finally:
            tok._cache.clear()
            tok._cache.update(saved)


@pytest.mark.parametrize("name", BPE_VOCABS)
@SETTINGS
@given(word=RUNS, prefix=st.sampled_from(["", " ", "x" * 300, "1" * 300]))
def test_bpe_kernel_matches_the_python_merge_loop(
    name: str, word: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = _load(name)
    text = prefix + word
    tok = v._tokenizer.bpe
    tok._cache.clear()
    assert v.tokenize(text, add_special=False) == _reference(v, text, monkeypatch)


@pytest.mark.parametrize("name", BPE_VOCABS)
def test_bpe_kernel_on_one_char_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    v = _load(name)
    for c in CHARS:
        for n in (257, 1000, 4099):
            v._tokenizer.bpe._cache.clear()
            assert v.tokenize(c * n, add_special=False) == _reference(v, c * n, monkeypatch), (c, n)


@SETTINGS
@given(word=RUNS)
def test_spm_kernel_matches_python_on_long_runs(word: str) -> None:
    v = _load("ggml-vocab-llama-spm.gguf")
    tok = v._tokenizer.spm
    text = ("\u2581" + word).replace(" ", "\u2581")
    assert tok.tokenize_kernel(text.encode()) == spm_python(text, tok.t2i, tok.scores, tok.byte_ids)


@pytest.mark.parametrize(
    "name", ["ggml-vocab-qwen2.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-bert-bge.gguf"]
)
@SETTINGS
@given(
    text=st.lists(st.sampled_from(["hello ", "x" * 50, "<|im_end|>", "é😀", "\n", "1234"]), max_size=30).map(
        "".join
    ),
    limit=st.integers(0, 60),
)
def test_max_tokens_is_exact_about_when_to_stop(name: str, text: str, limit: int) -> None:
    v = _load(name)
    full = v.tokenize(text, add_special=True, parse_special=True)
    if len(full) <= limit:
        assert v.tokenize(text, add_special=True, parse_special=True, max_tokens=limit) == full
    else:
        with pytest.raises(TooManyTokensError) as e:
            v.tokenize(text, add_special=True, parse_special=True, max_tokens=limit)
        assert e.value.max_tokens == limit


@pytest.mark.parametrize("name", ["ggml-vocab-qwen2.gguf", "ggml-vocab-llama-spm.gguf"])
def test_a_huge_text_past_the_limit_stops_at_once(name: str) -> None:
    v = _load(name)
    if hasattr(v._tokenizer, "bpe"):
        v._tokenizer.bpe.min_tokens("x")  # builds its table of the longest token per character, once
    for text in ("x" * 2_000_000, "hello world " * 200_000):
        t0 = time.monotonic()
        with pytest.raises(TooManyTokensError):
            v.tokenize(text, max_tokens=8192)
        assert time.monotonic() - t0 < 2  # about 0.1 s


def test_a_3m_char_word_is_fast_and_exact(smollm2_path: Path) -> None:
    """llama.cpp's merges on one 3,000,000-character word: 750,000 tokens of 'xxxx' (was 28 s, +1 GB)."""
    v = load_vocab(smollm2_path)
    v.tokenize("x" * 1000)  # the kernel's first use builds its pair table
    t0 = time.monotonic()
    ids = v.tokenize("x" * 3_000_000, add_special=False)
    elapsed = time.monotonic() - t0
    assert ids == [v.text_to_token("xxxx")] * 750_000
    assert elapsed < 15, elapsed  # about 1 s on an idle core


@pytest.mark.parametrize("name", ["ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf"])
@SETTINGS
@given(word=RUNS)
def test_min_tokens_is_a_lower_bound(name: str, word: str) -> None:
    v = _load(name)
    tok = v._tokenizer.bpe
    assert tok.min_tokens(word) <= len(tok._encode_word(word))
