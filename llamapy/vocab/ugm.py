"""Unigram (T5 / SentencePiece "unigram") as llama.cpp's llm_tokenizer_ugm_session.

The input is normalized with the vocabulary's precompiled character map (an XOR-compressed double
array, as SentencePiece stores it), spaces become '▁' (prefix/suffix/merging as the flags ask), then a
Viterbi pass picks the segmentation with the best total score; runs of unknown characters become one
unknown token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .vocab import TOKEN_NULL, TokenAttr, TokenizeError, VocabError

if TYPE_CHECKING:
    from .vocab import Vocab

_ESCAPED_SPACE = "\u2581".encode()
_NEG = -1.7976931348623157e308  # -DBL_MAX
_UNKNOWN_PENALTY = 10.0


def _utf8_len(b: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[b >> 4]


class _Charsmap:
    """SentencePiece's precompiled charsmap: XCDA entries + NUL-terminated replacement strings."""

    def __init__(self, blob: bytes):
        if len(blob) < 4:
            raise VocabError("tokenizer.ggml.precompiled_charsmap: too small for its header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise VocabError("tokenizer.ggml.precompiled_charsmap: XCDA size runs past the end")
        self.xcda = np.frombuffer(blob[4 : 4 + size - size % 4], dtype="<u4").astype(np.int64).tolist()
        self.repl = blob[4 + size :]

    def _node(self, i: int) -> int:
        if i >= len(self.xcda):
            raise TokenizeError("precompiled charsmap: index out of the XCDA array")
        return self.xcda[i]

    def longest(self, data: bytes, start: int) -> tuple[int, bytes] | None:
        """(length consumed, replacement) of the longest mapped prefix of ``data[start:]``."""
        if not self.xcda:
            return None

        def base(i: int) -> int:
            p = self._node(i)
            return (p >> 10) << ((p & (1 << 9)) >> 6)

        best_len = 0
        best_off = 0
        node = base(0)
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            node ^= c
            p = self._node(node)
            if p & ((1 << 31) | 0xFF) != c:
                break
            is_leaf = (p >> 8) & 1
            node ^= base(node)
            if is_leaf:
                best_len = pos - start + 1
                best_off = self._node(node) & ((1 << 31) - 1)
        if best_len == 0:
            return None
        if best_off >= len(self.repl):
            raise TokenizeError("precompiled charsmap: replacement index out of range")
        end = self.repl.find(b"\x00", best_off)
        if end == -1:
            raise TokenizeError("precompiled charsmap: unterminated replacement string")
        return best_len, self.repl[best_off:end]


class UGMTokenizer:
    def __init__(self, v: Vocab, md: Mapping[str, Any]):
        self.v = v
        cm = md.get("tokenizer.ggml.precompiled_charsmap")
        if cm is not None:
            arr = np.asarray(cm)
            if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.dtype.itemsize != 1:
                raise VocabError(
                    "tokenizer.ggml.precompiled_charsmap: invalid type (expected int8/uint8 array)"
                )
            self.charsmap: _Charsmap | None = _Charsmap(arr.astype(np.uint8).tobytes())
        else:
            self.charsmap = None
        attrs = v.attrs
        normal = (attrs & int(TokenAttr.NORMAL)) != 0
        self.min_score = float(v.scores[normal].min()) if normal.any() else 3.4028234663852886e38
        self.unknown_score = self.min_score - _UNKNOWN_PENALTY
        matchable = (attrs & int(TokenAttr.NORMAL | TokenAttr.USER_DEFINED | TokenAttr.UNUSED)) != 0
        self.tokens: dict[bytes, int] = {}
        self.prefixes: set[bytes] = set()
        self.user: set[bytes] = set()
        self.user_prefixes: set[bytes] = set()
        for i in np.flatnonzero(matchable).tolist():
            b = v.tokens[i].encode("utf-8", "surrogateescape")
            self.tokens[b] = i
            self.prefixes.update(b[:k] for k in range(1, len(b) + 1))
            if attrs[i] & TokenAttr.USER_DEFINED:
                self.user.add(b)
                self.user_prefixes.update(b[:k] for k in range(1, len(b) + 1))

    # --- normalization ----------------------------------------------------------------------------------

    def _normalize_prefix(self, data: bytes, i: int) -> tuple[bytes, int]:
        # user-defined tokens pass through untouched (longest match)
        best = 0
        k = 1
        while i + k <= len(data) and data[i : i + k] in self.user_prefixes:
            if data[i : i + k] in self.user:
                best = k
            k += 1
        if best:
            return data[i : i + best], best
        if self.charsmap is not None:
            m = self.charsmap.longest(data, i)
            if m is not None:
                return m[1], m[0]
        n = _utf8_len(data[i])
        chunk = data[i : i + n]
        if (
            len(chunk) == n
            and (n == 1 or all(c & 0xC0 == 0x80 for c in chunk[1:]))
            and not 0x80 <= data[i] < 0xC0
        ):
            if n == 4 and data[i] >= 0xF8:
                return "\ufffd".encode(), 1
            return chunk, n
        return "\ufffd".encode(), 1

    def normalize(self, data: bytes) -> bytes:
        v = self.v
        space = _ESCAPED_SPACE if v.escape_whitespaces else b" "
        prepend = not v.treat_whitespace_as_suffix and v.add_space_prefix
        append = v.treat_whitespace_as_suffix and v.add_space_prefix
        merge = v.remove_extra_whitespaces
        out = bytearray()
        prepended = False
        non_ws = False
        i = 0
        while i < len(data):
            norm, consumed = self._normalize_prefix(data, i)
            for c in norm:
                if c != 0x20:
                    if not non_ws:
                        non_ws = True
                        if (prepend and not prepended) or merge:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    non_ws = False
                    if not merge:
                        out += space
            i += consumed
        if append:
            out += space
        return bytes(out)

    # --- Viterbi ------------------------------------------------------------------------------------------

    def tokenize_bytes(self, data: bytes) -> list[int]:
        v = self.v
        s = self.normalize(data)
        n = len(s)
        if n == 0:
            return []
        unk = v.unk
        best_tok = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        best_score = [_NEG] * (n + 1)
        best_score[0] = 0.0
        tokens, prefixes, user = self.tokens, self.prefixes, self.user
        scores = v.scores
        i = 0
        while i < n:
            n_units = min(_utf8_len(s[i]), n - i)
            cur = best_score[i]
            single = False
            k = 1
            while i + k <= n:
                p = s[i : i + k]
                if p not in prefixes:
                    break
                tid = tokens.get(p)
                if tid is not None:
                    if k == n_units:
                        single = True
                    score = cur + (0.0 if p in user else float(scores[tid]))
                    if score > best_score[i + k]:
                        best_tok[i + k], best_from[i + k], best_score[i + k] = tid, i, score
                k += 1
            if not single:
                score = cur + self.unknown_score
                j = i + n_units
                if score > best_score[j]:
                    best_tok[j], best_from[j], best_score[j] = unk, i, score
            i += n_units
        out: list[int] = []
        prev_unknown = False
        j = n
        while True:
            t = best_tok[j]
            is_unknown = t == unk
            if not (prev_unknown and is_unknown):
                out.append(t)
            if best_from[j] == 0:
                break
            prev_unknown = is_unknown
            j = best_from[j]
        out.reverse()
        if TOKEN_NULL in out:
            raise TokenizeError("the UGM vocabulary has no unknown token for a character of the input")
        return out

    def tokenize_fragment(self, text: str) -> list[int]:
        return self.tokenize_bytes(text.encode("utf-8", "surrogatepass"))
