"""``load_into(vocab, metadata)``: llama.cpp's llama_vocab::impl::load, step by step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..gguf.string_index import StringIndex, positions
from ..gguf.strings import StringArray
from .pretokenize import pre_tokenizer
from .spm import TokenIndex
from .vocab import (
    _EOG_TEXTS,
    _EOM_TEXTS,
    _EOT_TEXTS,
    _FIM_MID_TEXTS,
    _FIM_PAD_TEXTS,
    _FIM_PRE_TEXTS,
    _FIM_REP_TEXTS,
    _FIM_SEP_TEXTS,
    _FIM_SUF_TEXTS,
    _SPECIAL_KEYS,
    _TYPE_TO_ATTR,
    TOKEN_NULL,
    TokenAttr,
    Vocab,
    VocabError,
    VocabType,
    _as_array,
    _as_bool,
    _key,
    special_ids_sorted,
)

_C = int(TokenAttr.CONTROL)


def _defaults(v: Vocab, md: Mapping[str, Any]) -> None:
    model = v.model
    if model == "llama":
        v.type = VocabType.SPM
        v.bos, v.eos, v.unk = 1, 2, 0
        v.add_space_prefix, v.clean_spaces, v.add_bos, v.add_eos = True, False, True, False
    elif model == "bert":
        v.type = VocabType.WPM
        v.bos, v.unk, v.sep, v.pad, v.mask = 101, 100, 102, 0, 103
        v.add_space_prefix, v.clean_spaces, v.add_bos, v.add_eos, v.add_sep = False, True, True, False, True
    elif model in ("gpt2", "gemma4"):
        v.type = VocabType.BPE
        if model == "gpt2":
            v.bos = v.eos = 11
        else:
            v.pre = "gemma4"
        pre = pre_tokenizer(v.pre)
        v.add_space_prefix, v.escape_whitespaces = False, pre.escape_whitespaces
        v.clean_spaces, v.ignore_merges = pre.clean_spaces, pre.ignore_merges
        if pre.add_bos is not None:
            v.add_bos = pre.add_bos
        if pre.add_sep is not None:
            v.add_sep = pre.add_sep
        if pre.no_bos_id:
            v.bos = TOKEN_NULL
        v._pre_tok = pre
    elif model == "t5":
        v.type = VocabType.UGM
        v.eos, v.unk, v.pad = 1, 2, 0
        v.add_bos, v.add_eos = False, True
    elif model in ("no_vocab", "none"):
        v.type = VocabType.NONE
    else:
        raise VocabError(f"tokenizer.ggml.model: unknown or unsupported tokenizer {model!r}")
    v.add_space_prefix = _as_bool(md, "add_space_prefix", v.add_space_prefix)
    v.remove_extra_whitespaces = _as_bool(md, "remove_extra_whitespaces", v.remove_extra_whitespaces)


def load_into(v: Vocab, md: Mapping[str, Any]) -> None:
    model = _key(md, "model")
    if model is None:
        raise VocabError("GGUF metadata has no tokenizer.ggml.model (no vocabulary in this file)")
    if not isinstance(model, str):
        raise VocabError(f"tokenizer.ggml.model: expected a string, got {type(model).__name__}")
    v.model = model
    pre = _key(md, "pre")
    v.pre = pre if isinstance(pre, str) else ""
    _defaults(v, md)
    if v.type is VocabType.NONE:
        n = md.get("tokenizer.ggml.vocab_size") or 0
        v.tokens = [""] * int(n)
        v.attrs = np.zeros(int(n), dtype=np.int32)
        v.scores = np.zeros(int(n), dtype=np.float32)
        return

    tokens = _key(md, "tokens")
    if tokens is None:
        raise VocabError("GGUF metadata has no tokenizer.ggml.tokens")
    if not isinstance(tokens, (list, StringArray)) or (tokens and not isinstance(tokens[0], str)):
        raise VocabError("tokenizer.ggml.tokens: invalid type (expected an array of strings)")
    n = len(tokens)
    scores = _as_array(md, "scores", n, "fi")
    types = _as_array(md, "token_type", n, "iu")
    v.tokens = _texts(tokens)
    # SPM looks texts up in its kernel's hash table; the others' Python loops want a mapping
    if v.type is VocabType.SPM:
        v.token_to_id = TokenIndex(v.tokens)
    elif isinstance(
        v.tokens, StringArray
    ):  # the file's array: looked up in its bytes until it pays to decode
        v.token_to_id = StringIndex(v.tokens, last=True)
    else:
        v.token_to_id = positions(v.tokens)
    v.scores = np.zeros(n, dtype=np.float32) if scores is None else scores.astype(np.float32)
    if types is None:
        attrs = np.full(n, int(TokenAttr.NORMAL), dtype=np.int32)
    else:
        t = types.astype(np.int64)
        attrs = np.where((t >= 0) & (t < len(_TYPE_TO_ATTR)), _TYPE_TO_ATTR[np.clip(t, 0, 6)], 0).astype(
            np.int32
        )
    v.attrs = attrs
    v._pieces = {}

    # the tokenizer itself (needed below for the newline token)
    from .tokenize import make_tokenizer

    v._tokenizer = make_tokenizer(v, md)
    v.nl = _newline(v)
    _special_ids(v, md)
    _flags(v, md)
    _detect_by_text(v)
    _eog(v)
    v.special_ids = special_ids_sorted(v.tokens, v.attrs)
    _per_model_attrs(v, md)


def _texts(tokens: list[str] | StringArray) -> list[str] | StringArray:
    """The token texts, an empty one named ``[EMPTY_<id>]`` as llama.cpp does (kept compact when the
    file's array is a StringArray, as a vocabulary's is)."""
    if isinstance(tokens, StringArray):
        empty = np.flatnonzero(tokens.byte_lengths() == 0)
        if not empty.size:
            return tokens
        tokens = tokens.tolist()
        for i in empty.tolist():
            tokens[i] = f"[EMPTY_{i}]"
        return StringArray.from_strings(tokens)
    out = list(tokens)
    for i, t in enumerate(out):
        if not t:
            out[i] = f"[EMPTY_{i}]"
    return out


def _newline(v: Vocab) -> int:
    if v.type is VocabType.SPM:
        t = v.token_to_id.get("<0x0A>", v.token_to_id.get("\n", TOKEN_NULL))
        return t if t != TOKEN_NULL else v.pad
    if v.type is VocabType.WPM:
        return v.pad
    ids = v._tokenizer.tokenize_fragment("\n")
    return ids[0] if ids else v.pad


def _special_ids(v: Vocab, md: Mapping[str, Any]) -> None:
    n = v.n_tokens
    for attr, key in _SPECIAL_KEYS:
        cur = getattr(v, attr)
        if cur >= 0 and cur >= n:
            cur = TOKEN_NULL
        new = _key(md, key)
        if new is not None:
            if not isinstance(new, (int, np.integer)) or isinstance(new, bool):
                raise VocabError(f"tokenizer.ggml.{key}: expected an integer, got {type(new).__name__}")
            if 0 <= int(new) < n:
                cur = int(new)
        setattr(v, attr, cur)


def _flags(v: Vocab, md: Mapping[str, Any]) -> None:
    v.add_bos = _as_bool(md, "add_bos_token", v.add_bos)
    v.add_eos = _as_bool(md, "add_eos_token", v.add_eos)
    v.add_sep = _as_bool(md, "add_sep_token", v.add_sep)
    pre_tok = v._pre_tok
    if pre_tok is not None and pre_tok.kind == "gemma4" and v.pre in ("gemma4", "granite-embed-multi-311m"):
        v.add_bos = True
    v.normalizer_lowercase = _as_bool(md, "normalizer.lowercase", True)
    v.normalizer_strip_accents = _as_bool(md, "normalizer.strip_accents", v.normalizer_lowercase)
    sup = _key(md, "suppress_tokens")
    if sup is not None:
        arr = np.asarray(sup)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise VocabError("tokenizer.ggml.suppress_tokens: invalid type (expected an int32 array)")
        v.suppress_tokens = [int(i) for i in arr if 0 <= int(i) < v.n_tokens]


def _find(v: Vocab, texts: tuple[str, ...]) -> int:
    for t in texts:
        i = v.token_to_id.get(t)
        if i is not None:
            return i
    return TOKEN_NULL


def _detect_by_text(v: Vocab) -> None:
    for attr, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pre", _FIM_PRE_TEXTS),
                        ("fim_suf", _FIM_SUF_TEXTS), ("fim_mid", _FIM_MID_TEXTS), ("fim_pad", _FIM_PAD_TEXTS),
                        ("fim_rep", _FIM_REP_TEXTS), ("fim_sep", _FIM_SEP_TEXTS)):  # fmt: skip
        if getattr(v, attr) == TOKEN_NULL:
            tid = _find(v, texts)
            if tid != TOKEN_NULL:
                setattr(v, attr, tid)
                v.attrs[tid] |= _C
    # control tokens named "unused" are unused
    ctrl = np.nonzero(v.attrs & _C)[0]
    for i in ctrl.tolist():
        if "unused" in v.tokens[i]:
            v.attrs[i] |= int(TokenAttr.UNUSED)


def _eog(v: Vocab) -> None:
    eog: set[int] = set()
    for tid in (v.fim_pad, v.fim_rep, v.fim_sep):
        if tid != TOKEN_NULL:
            eog.add(tid)
    for t in _EOG_TEXTS:
        tid = v.token_to_id.get(t)
        if tid is not None:
            eog.add(tid)
            v.attrs[tid] |= _C
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: always rendered
        tid = v.token_to_id.get(t)
        if tid is not None:
            v.attrs[tid] = int(TokenAttr.USER_DEFINED)
    for tid in (v.eos, v.eot, v.eom):
        if tid != TOKEN_NULL:
            eog.add(tid)
    texts = {v.tokens[t]: t for t in eog if 0 <= t < v.n_tokens}
    if "<|end|>" in texts and (
        ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
        or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
    ):
        end_id = texts["<|end|>"]
        eog.discard(end_id)
        v.attrs[end_id] = int(TokenAttr.USER_DEFINED)
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        s_id = texts["</s>"]
        eog.discard(s_id)
        v.attrs[s_id] = int(TokenAttr.NORMAL)
    v.eog_ids = frozenset(eog)


def _per_model_attrs(v: Vocab, md: Mapping[str, Any]) -> None:
    name = str(md.get("general.name") or "").lower()
    pre = v.pre if isinstance(_key(md, "pre"), str) else ""
    arch = str(md.get("general.architecture") or "")
    t2i = v.token_to_id

    def set_attr(text: str, attr: TokenAttr, on: bool) -> None:
        tid = t2i.get(text)
        if tid is not None:
            v.attrs[tid] = (v.attrs[tid] | int(attr)) if on else (v.attrs[tid] & ~int(attr))

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", TokenAttr.LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in v.special_ids:
            v.attrs[tid] |= int(TokenAttr.RSTRIP)
        set_attr("</s>", TokenAttr.RSTRIP, True)
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(t, TokenAttr.RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", TokenAttr.LSTRIP, True)
