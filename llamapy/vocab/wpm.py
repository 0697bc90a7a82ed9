"""WordPiece (BERT) as llama.cpp's llm_tokenizer_wpm_session: greedy longest match per word."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import unicode as U
from .vocab import TOKEN_NULL, TokenizeError

if TYPE_CHECKING:
    from .vocab import Vocab

_CHINESE = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
            (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # fmt: skip


def _is_chinese(cpt: int) -> bool:
    return any(a <= cpt <= b for a, b in _CHINESE)


class WPMTokenizer:
    def __init__(self, v: Vocab):
        # flags and special ids are read at call time: the loader sets them after building this
        self.v = v
        self.t2i = v.token_to_id

    def preprocess(self, text: str) -> list[str]:
        lowercase = self.v.normalizer_lowercase
        strip_accents = self.v.normalizer_strip_accents
        fl = U.flags_table()
        words = [""]
        for ch in text:
            cpt = ord(ch)
            if strip_accents:
                cpt = U.nfd_first(cpt)
            f = int(fl[cpt])
            if f & U.WHITESPACE:
                if words[-1]:
                    words.append("")
                continue
            if cpt == 0 or cpt == 0xFFFD or f & U.CONTROL:
                continue
            if strip_accents and f & U.MARK:
                continue
            s = chr(U.tolower(cpt) if lowercase else cpt)
            if f & U.PUNCTUATION or (cpt < 0x7F and f & U.SYMBOL) or _is_chinese(cpt):
                if words[-1]:
                    words.append("")
                words[-1] = s
                words.append("")
            else:
                words[-1] += s
        if not words[-1]:
            words.pop()
        return words

    def tokenize_fragment(self, text: str) -> list[int]:
        out: list[int] = []
        t2i = self.t2i
        unk = self.v.unk
        max_len = self.v.max_token_len
        for word in self.preprocess(text):
            if not word:
                continue
            # lengths are in UTF-8 bytes in llama.cpp; work on the bytes of the word
            w = ("\u2581" + word).encode("utf-8", "surrogatepass")
            n = len(w)
            start_len = len(out)
            i = 0
            while i < n:
                match = False
                for j in range(min(n, i + max_len + 1), i, -1):
                    tid = t2i.get(w[i:j].decode("utf-8", "surrogateescape"))
                    if tid is not None:
                        out.append(tid)
                        match = True
                        i = j
                        break
                if not match:
                    del out[start_len:]
                    break
            if len(out) == start_len:
                if unk == TOKEN_NULL:
                    raise TokenizeError(
                        f"the WordPiece vocabulary has no unknown token for the word {word!r}"
                    )
                out.append(unk)
        return out
