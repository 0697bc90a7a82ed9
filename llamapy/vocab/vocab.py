"""The vocabulary of a GGUF model: tokens, attributes, special ids and flags, as llama.cpp loads them.

``Vocab.from_metadata(metadata)`` follows llama.cpp's ``llama_vocab::impl::load`` step by step (type
defaults, pre-tokenizer flags, special ids, tokens recognized by their text, the end-of-generation set,
per-model attributes); ``tokenize``/``token_to_piece``/``detokenize`` follow its (de)tokenizer.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import LlamapyError
from .special import SpecialPartitioner

TOKEN_NULL = -1


class VocabError(LlamapyError):
    """The vocabulary in a GGUF file is missing, malformed or unsupported."""


class TokenizeError(LlamapyError):
    """Text cannot be tokenized with this vocabulary (e.g. it lacks a byte token it needs)."""


class TooManyTokensError(TokenizeError):
    """The text has more tokens than the ``max_tokens`` given to tokenize (it stopped there)."""

    def __init__(self, max_tokens: int):
        super().__init__(f"the text has more than {max_tokens} tokens")
        self.max_tokens = max_tokens


class VocabType(enum.Enum):
    NONE = "no vocab"
    SPM = "SPM"
    BPE = "BPE"
    WPM = "WPM"
    UGM = "UGM"


class TokenType(enum.IntEnum):
    """``tokenizer.ggml.token_type`` values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(enum.IntFlag):
    """llama_token_attr."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_TYPE_TO_ATTR = np.array([0, TokenAttr.NORMAL, TokenAttr.UNKNOWN, TokenAttr.CONTROL, TokenAttr.USER_DEFINED,
                          TokenAttr.UNUSED, TokenAttr.BYTE], dtype=np.int32)  # fmt: skip

_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")  # fmt: skip
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                  "<|code_prefix|>", "<|prefix|>")  # fmt: skip
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                  "<|code_suffix|>", "<|suffix|>")  # fmt: skip
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                  "<|code_middle|>", "<|middle|>")  # fmt: skip
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")  # fmt: skip

_SPECIAL_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
                 ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
                 ("pad", "padding_token_id"), ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"),
                 ("fim_suf", "fim_suf_token_id"), ("fim_mid", "fim_mid_token_id"),
                 ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
                 ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"),
                 ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"))  # fmt: skip

_ATTR_SPECIAL = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL)


def _key(md: Mapping[str, Any], name: str, default: Any = None) -> Any:
    return md.get("tokenizer.ggml." + name, default)


def _as_bool(md: Mapping[str, Any], name: str, default: bool) -> bool:
    v = _key(md, name)
    if v is None:
        return default
    if isinstance(v, (bool, int, np.bool_, np.integer)):
        return bool(v)
    raise VocabError(f"tokenizer.ggml.{name}: expected a bool, got {type(v).__name__}")


def _as_array(md: Mapping[str, Any], name: str, n: int, kinds: str) -> np.ndarray | None:
    v = _key(md, name)
    if v is None:
        return None
    arr = np.asarray(v)
    if arr.ndim != 1 or arr.dtype.kind not in kinds:
        raise VocabError(f"tokenizer.ggml.{name}: invalid type (expected a numeric array of kind {kinds!r})")
    if arr.shape[0] < n:
        raise VocabError(f"tokenizer.ggml.{name}: {arr.shape[0]} entries for {n} tokens")
    return arr[:n]


class Vocab:
    """A model's vocabulary and tokenizer (see module docstring)."""

    def __init__(self) -> None:
        self.type = VocabType.SPM
        self.model = ""
        self.pre = ""
        self.tokens: Sequence[str] = []  # a list, or the file's StringArray (llamapy.gguf.strings)
        self.scores = np.zeros(0, dtype=np.float32)
        self.attrs = np.zeros(0, dtype=np.int32)
        self.token_to_id: Mapping[str, int] = {}  # a dict, or for SPM the kernel's TokenIndex
        self.bos = self.eos = self.eot = self.eom = self.unk = self.sep = self.pad = self.mask = TOKEN_NULL
        self.fim_pre = self.fim_suf = self.fim_mid = self.fim_pad = self.fim_rep = self.fim_sep = TOKEN_NULL
        self.nl = TOKEN_NULL
        self.add_bos = self.add_eos = self.add_sep = False
        self.add_space_prefix = False
        self.remove_extra_whitespaces = False
        self.clean_spaces = False
        self.escape_whitespaces = True
        self.treat_whitespace_as_suffix = False
        self.ignore_merges = False
        self.normalizer_lowercase = True
        self.normalizer_strip_accents = True
        self.eog_ids: frozenset[int] = frozenset()
        self.special_ids: list[int] = []
        self.suppress_tokens: list[int] = []
        self._tokenizer: Any = None
        self._pre_tok: Any = None  # the BPE pre-tokenizer (llamapy.vocab.pretokenize.PreTokenizer)
        self._partitioner: SpecialPartitioner | None = None
        self._max_token_len = -1
        self._pieces: dict[int, bytes] = {}  # token_to_piece cache, filled as tokens are seen

    # --- loading --------------------------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Vocab:
        """Build the vocabulary from GGUF metadata (``GGUFReader(path).metadata``)."""
        from .loader import load_into

        v = cls()
        load_into(v, metadata)
        return v

    @property
    def max_token_len(self) -> int:
        """Length in bytes of the longest token text."""
        if self._max_token_len < 0 and hasattr(self.tokens, "byte_lengths"):
            lens = self.tokens.byte_lengths()
            self._max_token_len = int(lens.max()) if lens.size else 0
        if self._max_token_len < 0:
            self._max_token_len = max(
                (len(t.encode("utf-8", "surrogateescape")) for t in self.tokens), default=0
            )
        return self._max_token_len

    @property
    def partitioner(self) -> SpecialPartitioner:
        if self._partitioner is None:
            self._partitioner = SpecialPartitioner(self.special_ids, self.tokens)
        return self._partitioner

    # --- queries --------------------------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def _check(self, token: int) -> int:
        t = int(token)
        if not 0 <= t < len(self.tokens):
            raise LlamapyError(f"token id {t} is out of range (vocabulary of {len(self.tokens)} tokens)")
        return t

    def token_text(self, token: int) -> str:
        return self.tokens[self._check(token)]

    def token_score(self, token: int) -> float:
        return float(self.scores[self._check(token)])

    def token_attr(self, token: int) -> TokenAttr:
        return TokenAttr(int(self.attrs[self._check(token)]))

    def is_eog(self, token: int) -> bool:
        return token != TOKEN_NULL and int(token) in self.eog_ids

    def is_control(self, token: int) -> bool:
        return bool(self.attrs[self._check(token)] & TokenAttr.CONTROL)

    def is_byte(self, token: int) -> bool:
        return bool(self.attrs[self._check(token)] & TokenAttr.BYTE)

    def is_user_defined(self, token: int) -> bool:
        return bool(self.attrs[self._check(token)] & TokenAttr.USER_DEFINED)

    def is_unused(self, token: int) -> bool:
        return bool(self.attrs[self._check(token)] & TokenAttr.UNUSED)

    def is_normal(self, token: int) -> bool:
        return bool(self.attrs[self._check(token)] & TokenAttr.NORMAL)

    def text_to_token(self, text: str) -> int:
        return self.token_to_id.get(text, TOKEN_NULL)

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Vocab(type={self.type.value}, pre={self.pre!r}, n_tokens={self.n_tokens})"

    # --- tokenize -------------------------------------------------------------------------------------

    def tokenize(
        self,
        text: str | bytes,
        add_special: bool = True,
        parse_special: bool = False,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Token ids of ``text`` as llama_tokenize (bytes are taken as UTF-8, invalid bytes allowed).
        With ``max_tokens``, raises :class:`TooManyTokensError` as soon as the text is known to have more
        tokens (from a lower bound on a fragment's count, or after a word), without tokenizing the rest."""
        from .tokenize import tokenize

        return tokenize(self, text, add_special, parse_special, max_tokens)

    # --- detokenize -----------------------------------------------------------------------------------

    def _piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            from .tokenize import piece_for_cache

            p = piece_for_cache(self, token)
            self._pieces[token] = p
        return p

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The bytes of one token (control/unknown tokens are empty unless ``special``)."""
        t = self._check(token)
        if not special and self.attrs[t] & _ATTR_SPECIAL:
            return b""
        p = self._piece(t)
        while lstrip > 0 and p[:1] == b" ":
            p = p[1:]
            lstrip -= 1
        return p

    def detokenize_bytes(
        self, tokens: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        toks = [int(t) for t in tokens]
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and toks and toks[0] == self.bos:
            remove_space = False
            toks = toks[1:]
        if remove_special and self.add_eos and toks and toks[-1] == self.eos:
            toks = toks[:-1]
        parts = []
        for t in toks:
            parts.append(self.token_to_piece(t, unparse_special, 1 if remove_space else 0))
            remove_space = False
        text = b"".join(parts)
        if self.clean_spaces and text:
            text = _clean_spaces(text)
        return text

    def detokenize(
        self, tokens: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        """Text of ``tokens`` as llama_detokenize (invalid UTF-8 becomes U+FFFD)."""
        return self.detokenize_bytes(tokens, remove_special, unparse_special).decode("utf-8", "replace")


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three clean-up passes (' ?', " ' ", " 's" ...), on bytes."""
    t = bytearray(text)
    # pass 1: remove the space before ? ! . ,
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    # pass 2: " ' " -> "'"
    t = out
    out = bytearray(t[:1])
    i = 1
    n = len(t)
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            i += 1
            t[i] = 0  # llama.cpp overwrites the skipped space in place
        out.append(x)
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" -> no space
    t = out
    out = bytearray(t[:1])
    n = len(t)
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                out.pop()
            elif x1 not in b"td" and i + 2 < n:
                x2 = t[i + 2]
                if (x1 == 0x72 and x2 == 0x65) or (x1 == 0x76 and x2 == 0x65):
                    out.pop()
        out.append(x)
    return bytes(out)


def eog_ids(vocab: Any) -> np.ndarray:
    """The sorted end-of-generation token ids of a vocabulary: ``vocab.eog_ids`` where it has them (a
    :class:`Vocab`), else every id ``vocab.is_eog`` accepts (duck-typed vocabularies, test fakes)."""
    ids = getattr(vocab, "eog_ids", None)
    if ids is None:
        n = int(getattr(vocab, "n_tokens", 0) or getattr(vocab, "n_vocab", 0))
        ids = [t for t in range(n) if vocab.is_eog(t)]
    return np.array(sorted(int(t) for t in ids), dtype=np.int64)


def load_vocab(path: str | os.PathLike[str]) -> Vocab:
    """Load only the vocabulary of a GGUF model (reads the header; tensor data is not touched)."""
    from ..gguf import GGUFReader

    return Vocab.from_metadata(GGUFReader(path).metadata)


def special_ids_sorted(tokens: Sequence[str], attrs: np.ndarray) -> list[int]:
    """Control/user-defined/unknown tokens, longest UTF-8 text first (ties by id)."""
    mask = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
    ids = np.nonzero(attrs & int(mask))[0].tolist()
    ids.sort(key=lambda i: (-len(tokens[i].encode("utf-8", "surrogateescape")), i))
    return ids
