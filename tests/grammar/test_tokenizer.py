"""llguidance's tokenizer built from a vocabulary: pieces, special tokens, EOG, caching, exact tokenization."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from llamapy.grammar import LlamaGrammar, lltokenizer
from llamapy.grammar.tokenizer import _bulk_pieces, exact_tokenize, vocab_info
from llamapy.vocab import load_vocab
from tests.grammar.conftest import END_THINK, EOS, EOT, PAD, SPECIALS, THINK, TOOL_CALL, ToyVocab, matches


def test_toy_tokenizer(toy):
    tok = lltokenizer(toy)
    assert tok is lltokenizer(toy)  # cached per vocabulary object
    assert tok.vocab_size == toy.n_tokens
    assert sorted(tok.eos_tokens) == [EOS, EOT]  # every end-of-generation token
    for t in SPECIALS:
        assert tok.is_special_token(t)
    for t in (0, 97, 254, 262, toy.n_tokens - 1):
        assert not tok.is_special_token(t)
    assert tok.is_special_token(255)  # byte 0xFF is llguidance's special-token marker: never text
    assert tok.decode_bytes([104, 105, 262]) == b"hi" + toy.pieces[262]
    info = vocab_info(toy)
    assert info.special["<think>"] == THINK and info.special["<|tool_call|>"] == TOOL_CALL
    assert info.byte_tokens[ord("a")] == ord("a")


def test_special_tokens_are_not_text(toy):
    # the grammar's text "<think>" is spelled with text tokens; the special token is only <think>
    g = LlamaGrammar.from_string('root ::= "<think>" [a-z]+ "</think>"')
    assert matches(g, toy, toy.tokenize("<think>abc</think>"))  # spelled with text tokens
    s = g.sampler(toy)
    assert not (int(s.allowed_mask()[THINK >> 5]) >> (THINK & 31)) & 1
    g = LlamaGrammar.from_string("root ::= <think> [a-z]+ </think>")
    assert matches(g, toy, [THINK, 97, END_THINK]) and not matches(g, toy, toy.tokenize("<think>a</think>"))
    assert not vocab_info(toy).tokenizer.is_special_token(PAD + 10)


def test_cache_does_not_keep_the_vocabulary_alive():
    v = ToyVocab()
    lltokenizer(v)
    ref = weakref.ref(v)
    del v
    gc.collect()
    assert ref() is None


def test_real_vocabulary(smollm2):
    v = load_vocab_again(smollm2)
    t = time.perf_counter()
    info = vocab_info(v)
    assert time.perf_counter() - t < 3.0
    tok = info.tokenizer
    assert tok.vocab_size == smollm2.n_tokens
    assert sorted(tok.eos_tokens) == sorted(smollm2.eog_ids)
    im_end = smollm2.text_to_token("<|im_end|>")
    assert tok.is_special_token(im_end) and info.special["<|im_end|>"] == im_end
    text = 'Hello {"a": 1}\n  é🔵 <|im_end|>'
    assert tok.decode_bytes(tok.tokenize_str(text)) == text.encode()
    assert tok.tokenize_str("Hello world") == smollm2.tokenize("Hello world", add_special=False)
    del v
    gc.collect()
    assert tok.decode_bytes(tok.tokenize_str("Hello world")) == b"Hello world"  # vocabulary gone: greedy


def load_vocab_again(v):
    """A second vocabulary object of the same file (a fresh cache entry)."""
    import copy

    return copy.copy(v)


def test_bulk_pieces_match_token_to_piece(smollm2, gemma3_path, shared_dir):
    vocabs = [smollm2, load_vocab(gemma3_path)]
    for name in ("ggml-vocab-llama-spm.gguf", "ggml-vocab-qwen2.gguf", "ggml-vocab-bert-bge.gguf"):
        p = shared_dir / "vocab" / name
        if p.exists():
            vocabs.append(load_vocab(p))
    for v in vocabs:
        bulk = _bulk_pieces(v)
        assert bulk is not None
        assert bulk == [v.token_to_piece(i, special=True) for i in range(v.n_tokens)], v


def test_exact_tokenize_with_a_space_prefix(shared_dir):
    p = shared_dir / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not p.exists():
        pytest.skip("no llama-spm vocabulary")
    v = load_vocab(p)
    assert v.add_space_prefix
    info = vocab_info(v)
    for text in ["aaaa", "hello world", " x", '{"a": 1}', "\n\n  x", "é🔵"]:
        ids = exact_tokenize(v, text.encode(), False, info.tokenizer, info.byte_tokens)
        assert b"".join(v.token_to_piece(i, special=True) for i in ids) == text.encode()
        assert info.tokenizer.decode_bytes(info.tokenizer.tokenize_str(text)) == text.encode()
