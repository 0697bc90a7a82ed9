"""llguidance's tokenizer for a llamapy vocabulary, built once per vocabulary object and cached.

Token bytes are ``token_to_piece(t, special=True)``. Control and unknown tokens, and user-defined tokens
written like ``<...>``, get llguidance's special-token marker ``b"\\xff"`` in front, as llama.cpp and
llguidance's ``llamacpp.py`` do: a grammar reaches them only as ``<name>``/``<[id]>``, never as text.
Every end-of-generation (EOG) token is an EOS token for llguidance. The tokenize function llguidance
calls is the vocabulary's own ``tokenize(text, add_special=False, parse_special=False)`` (llguidance
handles special tokens itself, through the marker).

For a :class:`llamapy.vocab.Vocab` the pieces are computed in bulk from the token texts (a few string
operations over the whole vocabulary instead of one call per token); any other object only needs
``n_tokens``, ``token_to_piece``, ``token_attr``, ``is_eog``, ``bos``, ``eos`` and ``tokenize``.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

import llguidance
import numpy as np

from .._dataclass import dataclass
from ..vocab.vocab import TokenAttr, Vocab, VocabType, eog_ids
from .errors import GrammarError

MARKER = b"\xff"
_SPECIAL_ATTRS = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
_TEXT_ATTRS = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN | TokenAttr.USER_DEFINED)


@dataclass(frozen=True, eq=False)
class VocabInfo:
    """What the grammar layer needs from one vocabulary (see :func:`vocab_info`)."""

    tokenizer: llguidance.LLTokenizer
    n_vocab: int
    eog: np.ndarray  # int32 ids of the end-of-generation tokens, sorted
    special: dict[str, int]  # text of each marked (special) token -> its id (the first id wins)
    byte_tokens: dict[int, int]  # byte value -> a plain token whose piece is exactly that byte


class _TokenizeFn:
    """What ``llguidance.LLTokenizer`` accepts as a ``TokenizerWrapper``; holds the vocabulary weakly."""

    is_tokenizer_wrapper = True

    def __init__(self, vocab: Any, tokens: list[bytes], special_ids: list[int], eos: int, bos: int | None):
        try:
            self._vocab = weakref.ref(vocab)
        except TypeError:
            self._vocab = lambda: vocab
        self.tokens = tokens
        self.special_token_ids = special_ids
        self.eos_token_id = eos
        self.bos_token_id = bos

    lltok: llguidance.LLTokenizer | None = None
    byte_tokens: dict[int, int] | None = None

    def __call__(self, text: str | bytes) -> list[int]:
        # called from llguidance's Rust code, which panics on an exception: never raise
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
        v = self._vocab()
        try:
            if v is not None:
                return exact_tokenize(v, data, False, self.lltok, self.byte_tokens)
        except Exception:  # fall back to llguidance's own greedy tokenization
            pass
        if self.lltok is None:
            return []
        return [int(t) for t in self.lltok.greedy_tokenize(data.decode("utf-8", "replace"))]


def _joined(vocab: Any, ids: list[int]) -> bytes:
    return b"".join(bytes(vocab.token_to_piece(t, special=True)) for t in ids)


def exact_tokenize(
    vocab: Any,
    data: bytes,
    parse_special: bool,
    lltok: llguidance.LLTokenizer | None = None,
    byte_tokens: dict[int, int] | None = None,
) -> list[int]:
    """Tokens whose pieces are exactly ``data``: the vocabulary's tokenization when it is (the usual case),
    else without the space an SPM vocabulary puts in front, else llguidance's greedy tokenization, else
    one token per byte. llguidance turns text the grammar forces into these tokens, so they must spell it.
    """
    ids = [int(t) for t in vocab.tokenize(data, add_special=False, parse_special=parse_special)]
    if _joined(vocab, ids) == data:
        return ids
    if getattr(vocab, "add_space_prefix", False):  # tokenize "\n" + data and drop what spells " \n"
        ids2 = [int(t) for t in vocab.tokenize(b"\n" + data, add_special=False, parse_special=parse_special)]
        acc = b""
        for k, t in enumerate(ids2):
            acc += bytes(vocab.token_to_piece(t, special=True))
            if acc in (b"\n", b" \n"):
                if _joined(vocab, ids2[k + 1 :]) == data:
                    return ids2[k + 1 :]
                break
            if len(acc) >= 2:
                break
    if lltok is not None:
        try:
            greedy = [int(t) for t in lltok.greedy_tokenize(data.decode("utf-8"))]
        except UnicodeDecodeError:
            greedy = []
        if greedy and _joined(vocab, greedy) == data:
            return greedy
    if byte_tokens and all(b in byte_tokens for b in data):
        return [byte_tokens[b] for b in data]
    return ids


_CACHE: weakref.WeakKeyDictionary[Any, VocabInfo] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def lltokenizer(vocab: Any) -> llguidance.LLTokenizer:
    """The ``llguidance.LLTokenizer`` of ``vocab`` (built on first use, then cached per vocabulary object)."""
    return vocab_info(vocab).tokenizer


def vocab_info(vocab: Any) -> VocabInfo:
    """The cached :class:`VocabInfo` of ``vocab`` (built on first use; thread-safe)."""
    try:
        info = _CACHE.get(vocab)
    except TypeError:  # neither hashable nor weakly referenceable: build every time
        return _build(vocab)
    if info is not None:
        return info
    with _LOCK:
        info = _CACHE.get(vocab)
        if info is None:
            info = _build(vocab)
            _CACHE[vocab] = info
    return info


def token_pieces(vocab: Any) -> list[bytes]:
    """``token_to_piece(t, special=True)`` for every token id, in bulk for a ``Vocab``."""
    if isinstance(vocab, Vocab):
        pieces = _bulk_pieces(vocab)
        if pieces is not None:
            return pieces
    return [bytes(vocab.token_to_piece(t, special=True)) for t in range(int(vocab.n_tokens))]


def token_attrs(vocab: Any) -> np.ndarray:
    """The ``TokenAttr`` flags of every token as an int array."""
    if isinstance(vocab, Vocab):
        return np.asarray(vocab.attrs, dtype=np.int64)
    return np.array([int(vocab.token_attr(t)) for t in range(int(vocab.n_tokens))], dtype=np.int64)


def _build(vocab: Any) -> VocabInfo:
    n = int(vocab.n_tokens)
    if n <= 0:
        raise GrammarError("cannot build a grammar tokenizer for an empty vocabulary")
    pieces = token_pieces(vocab)
    attrs = token_attrs(vocab)
    special_ids: list[int] = []
    special: dict[str, int] = {}
    cand = np.nonzero(attrs & (_SPECIAL_ATTRS | int(TokenAttr.USER_DEFINED)))[0].tolist()
    for t in cand:
        p = pieces[t]
        if not p:
            continue
        if attrs[t] & _SPECIAL_ATTRS or (p.startswith(b"<") and p.endswith(b">")):
            pieces[t] = MARKER + p
            special_ids.append(t)
            special.setdefault(p.decode("utf-8", "replace"), t)
    byte_tokens: dict[int, int] = {}
    for t in np.nonzero(np.fromiter((len(p) == 1 for p in pieces), dtype=bool, count=n))[0].tolist():
        byte_tokens.setdefault(pieces[t][0], t)
    eog = eog_ids(vocab).astype(np.int32)
    eog = eog[(eog >= 0) & (eog < n)]
    eos = int(vocab.eos) if 0 <= int(getattr(vocab, "eos", -1)) < n else (int(eog[0]) if len(eog) else 0)
    bos = int(vocab.bos) if 0 <= int(getattr(vocab, "bos", -1)) < n else None
    fn = _TokenizeFn(vocab, pieces, special_ids, eos, bos)
    try:
        tok = llguidance.LLTokenizer(fn, n_vocab=n, eos_token=[int(t) for t in eog] or eos)
    except Exception as e:  # llguidance raises ValueError/RuntimeError with its own message
        raise GrammarError(f"cannot build llguidance's tokenizer for this vocabulary: {e}") from e
    del fn.tokens  # llguidance has its own copy; keep only the tokenize function alive
    fn.lltok = tok
    fn.byte_tokens = byte_tokens
    return VocabInfo(tok, n, eog, special, byte_tokens)


# --- bulk pieces for llamapy's Vocab ---------------------------------------------------------------------

_ESCAPED_SPACE = "\u2581"
_bytelevel: tuple[dict[int, int], re.Pattern[str]] | None = None


def _bytelevel_tables() -> tuple[dict[int, int], re.Pattern[str]]:
    global _bytelevel
    if _bytelevel is None:
        from ..vocab.unicode import BYTE_TO_UNICODE

        table = {ord(c): b for b, c in enumerate(BYTE_TO_UNICODE)}
        alphabet = "".join(BYTE_TO_UNICODE)
        _bytelevel = (table, re.compile("[^" + re.escape(alphabet) + "]"))
    return _bytelevel


def _bulk_pieces(v: Vocab) -> list[bytes] | None:
    """Pieces of every token as ``Vocab.token_to_piece(t, special=True)`` returns them, or None.

    Only plain NORMAL tokens go through the bulk path (the same text transform as the vocabulary's
    ``piece_for_cache``: ``\u2581`` to space for SPM-like vocabularies, GPT-2 byte-level decoding for BPE);
    every other token, and any token the bulk path cannot represent, is asked for one by one.
    """
    n = v.n_tokens
    attrs = np.asarray(v.attrs)
    fast = ((attrs & int(TokenAttr.NORMAL)) != 0) & ((attrs & _TEXT_ATTRS) == 0)
    if v.type in (VocabType.SPM, VocabType.WPM, VocabType.UGM) or (
        v.type is VocabType.BPE and v.escape_whitespaces
    ):
        texts = np.array(v.tokens, dtype=object)
        texts[~fast] = ""
        joined = "\x00".join(texts.tolist())
        if joined.count("\x00") != n - 1:
            return None  # a token text holds NUL: let the vocabulary answer
        pieces = joined.replace(_ESCAPED_SPACE, " ").encode("utf-8", "surrogateescape").split(b"\x00")
    elif v.type is VocabType.BPE:
        table, outside = _bytelevel_tables()
        texts = np.array(v.tokens, dtype=object)
        lens = np.fromiter((len(t) for t in v.tokens), dtype=np.int64, count=n)
        offs = np.concatenate(([0], np.cumsum(lens)))
        bad = [m.start() for m in outside.finditer("".join(v.tokens))]
        if bad:
            fast[np.searchsorted(offs, np.array(bad), side="right") - 1] = False
        texts[~fast] = ""
        lens[~fast] = 0
        offs = np.concatenate(([0], np.cumsum(lens))).tolist()
        data = "".join(texts.tolist()).translate(table).encode("latin-1")
        pieces = [data[offs[i] : offs[i + 1]] for i in range(n)]
    else:
        return None
    if len(pieces) != n:
        return None
    for t in np.nonzero(~fast)[0].tolist():
        pieces[t] = v.token_to_piece(t, special=True)
    return pieces


def special_token_id(vocab: Any, text: str) -> int | None:
    """The id of the special (marked) token whose text is ``text``, or None: a grammar names such a
    token as ``<text>``/``<[id]>``, never as literal text."""
    return vocab_info(vocab).special.get(text)
