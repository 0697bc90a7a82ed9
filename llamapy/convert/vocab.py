"""The tokenizer of a Hugging Face checkpoint as GGUF ``tokenizer.ggml.*`` keys, as llama.cpp's
``convert_hf_to_gguf.py`` writes them:

- SentencePiece (``tokenizer.model``): read with a small protobuf reader (no sentencepiece package),
  then ``added_tokens.json`` and ``tokenizer_config.json``'s ``added_tokens_decoder`` on top
  (``_create_vocab_sentencepiece``);
- GPT-2 style BPE (``tokenizer.json`` through the ``tokenizers`` package): tokens, types, merges and
  ``tokenizer.ggml.pre`` from the hash of the tokenization of llama.cpp's check text
  (``get_vocab_base_pre``; the table is :mod:`llamapy.convert.pre_hashes`);
- special ids, ``add_bos/eos`` and the chat template as gguf-py's ``SpecialVocab`` reads them
  (:mod:`llamapy.convert.special_vocab`, our own code).

``kv`` is a gguf-py ``GGUFWriter`` used as the ordered key/value collector.
"""

from __future__ import annotations

import json
import struct
from hashlib import sha256
from pathlib import Path
from typing import Any

from .errors import ConvertError
from .pre_hashes import CHKTXT, PRE_HASHES
from .special_vocab import SpecialVocab

# SentencePiece piece types (sentencepiece_model.proto) -> llama.cpp's token types
SPM_NORMAL, SPM_UNKNOWN, SPM_CONTROL, SPM_USER_DEFINED, SPM_UNUSED, SPM_BYTE = 1, 2, 3, 4, 5, 6
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
# sentencepiece's IsUnknown/IsControl/IsUnused/IsByte, else normal (user-defined pieces too)
_SPM_TYPES = {SPM_UNKNOWN: TT_UNKNOWN, SPM_CONTROL: TT_CONTROL, SPM_UNUSED: TT_UNUSED, SPM_BYTE: TT_BYTE}


# ---------------------------------------------------------------------------------------------
# a minimal protobuf reader (wire format) for sentencepiece's ModelProto


def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("truncated varint")
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def _fields(b: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message: varints as int, 32-bit as bytes, length-delimited
    as bytes."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 1:
            v, i = b[i : i + 8], i + 8
        elif wire == 2:
            n, i = _varint(b, i)
            v, i = b[i : i + n], i + n
        elif wire == 5:
            v, i = b[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(b):
            raise ValueError("truncated message")
        out.append((num, wire, v))
    return out


def read_sentencepiece(path: Path) -> list[tuple[str, float, int]]:
    """(piece, score, type) of every piece of a SentencePiece model file, in id order."""
    try:
        data = path.read_bytes()
        pieces: list[tuple[str, float, int]] = []
        for num, wire, v in _fields(data):
            if num != 1 or wire != 2:
                continue
            piece, score, typ = "", 0.0, SPM_NORMAL
            for n2, w2, v2 in _fields(v):
                if n2 == 1 and w2 == 2:
                    piece = v2.decode("utf-8")
                elif n2 == 2 and w2 == 5:
                    score = struct.unpack("<f", v2)[0]
                elif n2 == 3 and w2 == 0:
                    typ = v2
            pieces.append((piece, score, typ))
    except OSError as e:
        raise ConvertError(f"{path}: cannot read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise ConvertError(f"{path.name}: not a SentencePiece model ({e})") from None
    if not pieces:
        raise ConvertError(f"{path.name}: not a SentencePiece model (no pieces)")
    return pieces


# ---------------------------------------------------------------------------------------------


def does_token_look_special(token: str) -> bool:
    """llama.cpp's ``TextModel.does_token_look_special``."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConvertError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path.name}: not valid JSON ({e})") from None


def sentencepiece_vocab(d: Path, vocab_size: int | None) -> tuple[list[bytes], list[float], list[int]]:
    """``_create_vocab_sentencepiece``: tokens, scores, types padded to ``vocab_size``."""
    path = d / "tokenizer.model"
    pieces = read_sentencepiece(path)
    n = vocab_size or len(pieces)
    tokens = [f"[PAD{i}]".encode() for i in range(n)]
    scores = [-10000.0] * n
    types = [TT_UNUSED] * n
    for i, (piece, score, typ) in enumerate(pieces[:n]):
        tokens[i] = piece.encode("utf-8")
        scores[i] = score
        types[i] = _SPM_TYPES.get(typ, TT_NORMAL)
    if (d / "added_tokens.json").is_file():
        for key, tid in _json(d / "added_tokens.json").items():
            if tid < n:
                tokens[tid], scores[tid], types[tid] = key.encode("utf-8"), -1000.0, TT_USER_DEFINED
    if (d / "tokenizer_config.json").is_file():
        for tid_s, data in _json(d / "tokenizer_config.json").get("added_tokens_decoder", {}).items():
            tid, tok = int(tid_s), data["content"]
            if tid >= n:
                continue
            if data.get("special") or does_token_look_special(tok):
                types[tid] = TT_CONTROL
            else:
                tok = tok.replace("\u2581", " ")
                types[tid] = TT_USER_DEFINED
            scores[tid] = -1000.0
            tokens[tid] = tok.encode("utf-8")
    return tokens, scores, types


def phi3_vocab(d: Path, vocab_size: int | None) -> tuple[list[bytes], list[float], list[int]]:
    """Phi3MiniModel.set_vocab's variant: added tokens (added_tokens.json, the tokenizer_config's
    added_tokens_decoder, tokenizer.json's added_tokens) are user-defined unless marked special."""
    pieces = read_sentencepiece(d / "tokenizer.model")
    n = vocab_size or len(pieces)
    tokens = [f"[PAD{i}]".encode() for i in range(n)]
    scores = [-10000.0] * n
    types = [TT_UNUSED] * n
    for i, (piece, score, typ) in enumerate(pieces):
        if i >= n:
            raise ConvertError(f"tokenizer.model has {len(pieces)} pieces, more than vocab_size {n}")
        tokens[i], scores[i] = piece.encode("utf-8"), score
        types[i] = _SPM_TYPES.get(typ, TT_NORMAL)
    if (d / "added_tokens.json").is_file():
        for key, tid in _json(d / "added_tokens.json").items():
            if tid < n:
                tokens[tid], scores[tid], types[tid] = key.encode("utf-8"), -1000.0, TT_USER_DEFINED
    added: list[tuple[int, dict]] = []
    if (d / "tokenizer_config.json").is_file():
        dec = _json(d / "tokenizer_config.json").get("added_tokens_decoder", {})
        added += [(int(k), v) for k, v in dec.items()]
    if (d / "tokenizer.json").is_file():
        added += [(int(a["id"]), a) for a in _json(d / "tokenizer.json").get("added_tokens", [])]
    for tid, data in added:
        if tid >= n:
            raise ConvertError(f"added token {data['content']!r} has id {tid}, past vocab_size {n}")
        tokens[tid], scores[tid] = data["content"].encode("utf-8"), -1000.0
        types[tid] = TT_CONTROL if data.get("special") else TT_USER_DEFINED
    return tokens, scores, types


def set_vocab_sentencepiece(kv: Any, d: Path, vocab_size: int | None, phi3: bool = False) -> int:
    if not (d / "tokenizer.model").is_file():
        raise ConvertError(f"{d}: no tokenizer.model (SentencePiece), which this architecture needs")
    tokens, scores, types = (phi3_vocab if phi3 else sentencepiece_vocab)(d, vocab_size)
    kv.add_tokenizer_model("llama")
    kv.add_tokenizer_pre("default")
    kv.add_token_list(tokens)
    kv.add_token_scores(scores)
    kv.add_token_types(types)
    SpecialVocab(d, n_vocab=len(tokens)).add_to_gguf(kv, quiet=True)
    return len(tokens)


def _load_bpe(d: Path) -> Any:
    path = d / "tokenizer.json"
    if not path.is_file():
        raise ConvertError(f"{d}: no tokenizer (tokenizer.json or tokenizer.model)")
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust parser's exception type is not exported
        raise ConvertError(f"{path.name}: cannot read it with the tokenizers package ({e})") from None


def vocab_base_pre(tok: Any) -> str:
    """``get_vocab_base_pre``: the pre-tokenizer name from the hash of the check text's token ids."""
    ids = tok.encode(CHKTXT).ids
    h = sha256(str(ids).encode()).hexdigest()
    if h not in PRE_HASHES:
        raise ConvertError(
            f"unknown BPE pre-tokenizer (check-text hash {h}): add it to llamapy/convert/pre_hashes.py "
            "(as llama.cpp's convert_hf_to_gguf_update.py adds it to get_vocab_base_pre) with the "
            "name of the pre-tokenizer llamapy should use"
        )
    return PRE_HASHES[h]


def _vocab_base(d: Path, vocab_size: int | None) -> tuple[list[str], list[int], str, Any]:
    """``get_vocab_base`` with the tokenizers package instead of transformers: (tokens, types, pre, tok)."""
    tok = _load_bpe(d)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    n = vocab_size if vocab_size is not None else len(vocab)
    if vocab and max(vocab.values()) >= n:
        raise ConvertError(
            f"the tokenizer has ids up to {max(vocab.values())}, past vocab_size {n} of config.json"
        )
    pre = vocab_base_pre(tok)
    added = {a["content"]: a for a in _json(d / "tokenizer.json").get("added_tokens", [])}
    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(TT_UNUSED)
            continue
        token = reverse[i]
        a = added.get(token)
        if a is not None and a.get("id", i) == i:
            if not a.get("normalized", True):
                token = tok.decode(tok.encode(token, add_special_tokens=False).ids, skip_special_tokens=False)
            if a.get("special") or does_token_look_special(token):
                types.append(TT_CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(TT_USER_DEFINED)
        else:
            types.append(TT_NORMAL)
        tokens.append(token)
    return tokens, types, pre, tok


def set_vocab_gpt2(kv: Any, d: Path, vocab_size: int | None, special: dict[str, str] | None = None) -> int:
    """``_set_vocab_gpt2``; ``special``: special token types set to added tokens (by content) where the
    files set none (GLM-4's)."""
    tokens, types, pre, tok = _vocab_base(d, vocab_size)
    n = len(tokens)
    kv.add_tokenizer_model("gpt2")
    kv.add_tokenizer_pre(pre)
    kv.add_token_list(tokens)
    kv.add_token_types(types)
    sv = SpecialVocab(d, load_merges=True, special_token_types=_special_types(special))
    for typ, content in (special or {}).items():
        added_vocab = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
        if content not in added_vocab:
            raise ConvertError(f"the tokenizer has no added token {content!r}, which this architecture needs")
        sv._set_special_token(typ, added_vocab[content])
    sv.add_to_gguf(kv, quiet=True)
    return n


def set_vocab_bert(kv: Any, d: Path, vocab_size: int | None, type_vocab_size: int) -> int:
    """BertModel.set_vocab: WordPiece as "phantom space" tokens (a word's first piece after U+2581, the
    ``##`` of its continuations dropped, control tokens as they are)."""
    tokens, types, pre, _tok = _vocab_base(d, vocab_size)
    kv.add_token_type_count(type_vocab_size)
    tokens = [t if ty == TT_CONTROL else t[2:] if t.startswith("##") else "\u2581" + t
              for t, ty in zip(tokens, types, strict=True)]  # fmt: skip
    kv.add_tokenizer_model("bert")
    kv.add_tokenizer_pre(pre)
    kv.add_token_list(tokens)
    kv.add_token_types(types)
    SpecialVocab(d, n_vocab=len(tokens)).add_to_gguf(kv, quiet=True)
    return len(tokens)


_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _hf_special_tokens(d: Path) -> list[str]:
    """transformers' ``all_special_tokens`` from tokenizer_config.json: the named ones (``*_token`` keys,
    the model-specific ones too), then ``extra_special_tokens`` (``additional_special_tokens``)."""
    cfg = _json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
    out: list[str] = []

    def add(v: Any) -> None:
        s = v.get("content") if isinstance(v, dict) else v
        if isinstance(s, str) and s not in out:
            out.append(s)

    for k in _NAMED_SPECIALS:
        add(cfg.get(k))
    extra = cfg.get("extra_special_tokens", cfg.get("additional_special_tokens"))
    for k, v in cfg.items():
        if k.endswith("_token") and k not in _NAMED_SPECIALS:
            add(v)
    if isinstance(extra, dict):
        for v in extra.values():
            add(v)
    elif isinstance(extra, list):
        for v in extra:
            add(v)
    return out


# tokens Gemma4Model.set_vocab keeps rendered (USER_DEFINED) for the chat parser
_GEMMA4_VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                   "<tool_response|>", '<|"|>'}  # fmt: skip


def set_vocab_gemma4(kv: Any, d: Path) -> int:
    """Gemma4Model.set_vocab: gguf-py's ``LlamaHfVocab`` (tokenizer.json, a byte-fallback BPE) read with
    the tokenizers package: the base vocabulary in id order (``<0xXX>`` BYTE, transformers' special
    tokens CONTROL, the rest NORMAL), then the added tokens past it (special: CONTROL, else USER_DEFINED),
    every score -1000; Gemma 4's visible tokens USER_DEFINED; merges and special ids; no space prefix,
    BOS added."""
    import re

    path = d / "tokenizer.json"
    if not path.is_file():
        raise ConvertError(f"{d}: no tokenizer.json, which Gemma 4 needs")
    tj = _json(path)
    m = tj.get("model") if isinstance(tj, dict) else None
    if (
        not isinstance(m, dict)
        or m.get("type") != "BPE"
        or not m.get("byte_fallback", False)
        or ((tj.get("decoder") or {}).get("type") != "Sequence")
    ):
        raise ConvertError(f"{path.name}: not a byte-fallback BPE tokenizer (Gemma 4's LlamaHfVocab)")
    tok = _load_bpe(d)
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    n_base = tok.get_vocab_size(with_added_tokens=False)
    reverse = {i: t for t, i in vocab.items()}
    added = sorted(((t.content, i) for i, t in tok.get_added_tokens_decoder().items()), key=lambda x: x[1])
    added = [(t, i) for t, i in added if i >= n_base]
    specials = {t: vocab[t] for t in _hf_special_tokens(d) if t in vocab}
    special_ids = set(specials.values())
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_base):
        if i not in reverse:
            raise ConvertError(f"{path.name}: no token with id {i} in a base vocabulary of {n_base}")
        t = reverse[i]
        tokens.append(t)
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            types.append(TT_BYTE)
        else:
            types.append(TT_CONTROL if i in special_ids else TT_NORMAL)
    for t, _i in added:
        tokens.append(t)
        types.append(TT_CONTROL if t in specials and specials[t] in special_ids else TT_USER_DEFINED)
    types = [TT_USER_DEFINED if t in _GEMMA4_VISIBLE else ty for t, ty in zip(tokens, types, strict=True)]
    kv.add_tokenizer_model("gemma4")
    kv.add_token_list(tokens)
    kv.add_token_scores([-1000.0] * len(tokens))
    kv.add_token_types(types)
    SpecialVocab(d, load_merges=True).add_to_gguf(kv, quiet=True)
    kv.add_add_space_prefix(False)
    kv.add_add_bos_token(True)
    return len(tokens)


def _special_types(special: dict[str, str] | None) -> Any:
    base = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    return None if not special else base + tuple(t for t in special if t not in base)


def set_vocab(
    kv: Any,
    d: Path,
    kind: str,
    vocab_size: int | None,
    special: dict[str, str] | None = None,
    type_vocab_size: int = 1,
) -> None:
    """``kind``: "spm" (tokenizer.model), "gpt2" (tokenizer.json), "spm|gpt2" (the first present), "phi3"
    (Phi-3's SentencePiece variant), "bert" (WordPiece tokenizer.json)."""
    if kind == "bert":
        set_vocab_bert(kv, d, vocab_size, type_vocab_size)
    elif kind in ("spm", "phi3") or (kind == "spm|gpt2" and (d / "tokenizer.model").is_file()):
        set_vocab_sentencepiece(kv, d, vocab_size, phi3=kind == "phi3")
    else:
        set_vocab_gpt2(kv, d, vocab_size, special)
