"""llama.cpp's llama_vocab::impl::tokenize and token_to_piece, over the per-type tokenizers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..gguf.strings import StringArray
from . import unicode as U
from .bpe import OverBudget
from .vocab import (
    _ATTR_SPECIAL,
    TOKEN_NULL,
    TokenAttr,
    TokenizeError,
    TooManyTokensError,
    Vocab,
    VocabError,
    VocabType,
)

_ESCAPED_SPACE = "\u2581"


class _BPE:
    def __init__(self, v: Vocab, md: Mapping[str, Any]):
        from .bpe import BPETokenizer

        merges = md.get("tokenizer.ggml.merges")
        if merges is None and v.pre == "kimi-k2":
            merges = []  # llama.cpp loads Kimi-K2 vocabularies without merges (each word then by its pieces)
        if merges is None:
            raise VocabError("BPE vocabulary without tokenizer.ggml.merges")
        if not isinstance(merges, (list, StringArray)) or (merges and not isinstance(merges[0], str)):
            raise VocabError("tokenizer.ggml.merges: invalid type (expected an array of strings)")
        self.escape = v.escape_whitespaces
        self.bpe = BPETokenizer(v.token_to_id, merges, v._pre_tok, v.pre == "gemma4")

    def tokenize_fragment(self, text: str, max_tokens: int | None = None) -> list[int]:
        if self.escape:
            text = text.replace(" ", _ESCAPED_SPACE)
        return self.bpe.tokenize(text, max_tokens)


class _SPM:
    def __init__(self, v: Vocab):
        from .spm import SPMTokenizer

        t2i = v.token_to_id
        byte_ids = np.full(256, TOKEN_NULL, dtype=np.int64)
        for b in range(256):
            tid = t2i.get(f"<0x{b:02X}>")
            if tid is None:
                tid = t2i.get(bytes([b]).decode("utf-8", "surrogateescape"), TOKEN_NULL)
            byte_ids[b] = tid
        self.spm = SPMTokenizer(v.tokens, v.token_to_id, v.scores, byte_ids)

    def tokenize_bytes(self, data: bytes) -> list[int]:
        ids = self.spm.tokenize(data.replace(b" ", b"\xe2\x96\x81"))
        if TOKEN_NULL in ids:
            raise TokenizeError(
                "the SPM vocabulary has no byte token for a byte of the input (byte fallback)"
            )
        return ids


def make_tokenizer(v: Vocab, md: Mapping[str, Any]) -> Any:
    if v.type is VocabType.BPE:
        return _BPE(v, md)
    if v.type is VocabType.SPM:
        return _SPM(v)
    if v.type is VocabType.WPM:
        from .wpm import WPMTokenizer

        return WPMTokenizer(v)
    if v.type is VocabType.UGM:
        from .ugm import UGMTokenizer

        return UGMTokenizer(v, md)
    raise VocabError(f"no tokenizer for vocabulary type {v.type.value}")


def _prepare(text: str | bytes) -> tuple[str, bool]:
    """(text for the special-token split, whether it is valid UTF-8).

    Invalid UTF-8 (or a str with lone surrogates, taken as their 3-byte forms) is carried with
    surrogateescape so that every fragment can be turned back into the exact input bytes.
    """
    if isinstance(text, str):
        try:
            text.encode("utf-8")
            return text, True
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
    else:
        raise TypeError(f"tokenize: expected str or bytes, got {type(text).__name__}")
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape"), False


class _Budget:
    """``max_tokens`` of a tokenize call: what is left, and a lower bound on a fragment's count (a token
    covers at most ``max_token_len`` bytes of text; BPE and SPM only, where no normalization shrinks it)."""

    def __init__(self, v: Vocab, max_tokens: int | None):
        self.max_tokens = max_tokens
        self.bound = max_tokens is not None and v.type in (VocabType.BPE, VocabType.SPM)
        self.per_token = max(1, v.max_token_len) if self.bound else 1

    def left(self, out: list[int], n_bytes: int) -> int | None:
        """Tokens the next fragment may still take (None: no limit); raises when ``out`` is already past
        the limit or a fragment of ``n_bytes`` must take more than is left."""
        if self.max_tokens is None:
            return None
        left = self.max_tokens - len(out)
        if left < 0 or (self.bound and -(-n_bytes // self.per_token) > left):
            raise TooManyTokensError(self.max_tokens)
        return left


def tokenize(
    v: Vocab, text: str | bytes, add_special: bool, parse_special: bool, max_tokens: int | None = None
) -> list[int]:
    if v.type is VocabType.NONE:
        raise TokenizeError("this model has no vocabulary")
    s, valid = _prepare(text)
    if s and v.special_ids:
        skip = 0 if parse_special else _ATTR_SPECIAL
        frags = v.partitioner.partition(s, v.attrs, skip, int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP))
    elif s:
        frags = [(0, len(s), -1)]
    else:
        frags = []
    tok = v._tokenizer
    out: list[int] = []
    budget = _Budget(v, max_tokens)

    def raw_str(a: int, b: int) -> str:
        piece = s[a:b]
        return piece if valid else U.decode_utf8(piece.encode("utf-8", "surrogateescape"))

    def raw_bytes(a: int, b: int) -> bytes:
        return s[a:b].encode("utf-8", "surrogateescape")

    wpm = v.type is VocabType.WPM  # (its specials are CLS first and SEP last, always)
    if add_special and (wpm or v.add_bos):
        _add(out, v.bos, "BOS (CLS)" if wpm else "BOS")
    if v.type is VocabType.SPM:
        prev_special = True
        for a, b, t in frags:
            if t == -1:
                data = raw_bytes(a, b)
                if v.add_space_prefix and prev_special:
                    data = b" " + data
                budget.left(out, len(data))
                out.extend(tok.tokenize_bytes(data))
                prev_special = False
            else:
                out.append(t)
                prev_special = True
    elif v.type is VocabType.BPE:
        for a, b, t in frags:
            if t == -1:
                piece = raw_str(a, b)
                try:
                    out.extend(tok.tokenize_fragment(piece, budget.left(out, len(piece))))
                except OverBudget:
                    raise TooManyTokensError(budget.max_tokens or 0) from None
            else:
                out.append(t)
    elif wpm:
        for a, b, t in frags:
            budget.left(out, 0)
            out.extend(tok.tokenize_fragment(raw_str(a, b)) if t == -1 else (t,))
    elif v.type is VocabType.UGM:
        for a, b, t in frags:
            budget.left(out, 0)
            out.extend(tok.tokenize_bytes(raw_bytes(a, b)) if t == -1 else (t,))
    if add_special and (wpm or v.add_eos):
        _add(out, v.sep if wpm else v.eos, "SEP" if wpm else "EOS")
    budget.left(out, 0)
    return out


def _add(out: list[int], tid: int, what: str) -> None:
    """Append the special token ``tid`` (a ``what``), which the vocabulary must have."""
    if tid == TOKEN_NULL:
        raise TokenizeError(f"the vocabulary asks to add a {what} token but has none")
    out.append(tid)


def _token_to_byte(text: str) -> int:
    try:
        return int(text[3:5], 16) & 0xFF
    except ValueError:
        return 0


def _decode_bytelevel(text: str) -> bytes:
    """llama_decode_text: GPT-2 byte-level chars back to bytes (unknown chars marked as llama.cpp does)."""
    m = U.UNICODE_TO_BYTE
    try:
        return bytes([m[c] for c in text])
    except KeyError:
        pass
    raw = text.encode("utf-8", "surrogateescape")
    cps = U.decode_utf8(raw)
    out = bytearray()
    for c in cps:
        b = m.get(c)
        if b is not None:
            out.append(b)
        else:
            utf8 = U.encode_utf8(c)
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + raw + b"]"
    return bytes(out)


def piece_for_cache(v: Vocab, token: int) -> bytes:
    """token_to_piece(token, special=True) without lstrip: what llama.cpp caches per token."""
    attr = int(v.attrs[token])
    text = v.tokens[token]
    if attr & (_ATTR_SPECIAL | TokenAttr.USER_DEFINED):
        return text.encode("utf-8", "surrogateescape")
    if v.type in (VocabType.SPM, VocabType.WPM, VocabType.UGM) or (
        v.type is VocabType.BPE and v.escape_whitespaces
    ):
        if attr & TokenAttr.NORMAL:
            return text.replace(_ESCAPED_SPACE, " ").encode("utf-8", "surrogateescape")
        if attr & TokenAttr.BYTE:
            return bytes([_token_to_byte(text)])
        return b""
    if v.type is VocabType.BPE:
        if attr & TokenAttr.NORMAL:
            return _decode_bytelevel(text)
        if attr & TokenAttr.BYTE:
            return bytes([_token_to_byte(text)])
    return b""
