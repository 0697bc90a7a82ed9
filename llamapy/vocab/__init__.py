"""Vocabularies and tokenizers identical to llama.cpp's: SPM, BPE (with its pre-tokenizers), WPM, UGM."""

from .vocab import (
    TOKEN_NULL,
    TokenAttr,
    TokenizeError,
    TokenType,
    TooManyTokensError,
    Vocab,
    VocabError,
    VocabType,
    eog_ids,
    load_vocab,
)

__all__ = [
    "TOKEN_NULL",
    "TokenAttr",
    "TokenType",
    "TokenizeError",
    "TooManyTokensError",
    "Vocab",
    "VocabError",
    "VocabType",
    "eog_ids",
    "load_vocab",
]
