"""Unicode helpers that classify and decode text exactly as llama.cpp's ``unicode.cpp`` does.

- ``decode_utf8``: llama.cpp's lenient UTF-8 decoder (overlong forms and surrogates are accepted, every
  byte of an invalid sequence becomes U+FFFD).
- ``flags``: per-codepoint category flags (Unicode 15.1, the tables llama.cpp ships).
- ``collapse``: the one-char-per-codepoint "collapsed" text llama.cpp runs its regexes on.
- GPT-2's byte <-> unicode mapping used by byte-level BPE.
"""

from __future__ import annotations

import codecs
from functools import lru_cache

import numpy as np

UNDEFINED, NUMBER, LETTER, SEPARATOR, MARK, PUNCTUATION, SYMBOL, CONTROL = 1, 2, 4, 8, 16, 32, 64, 128
WHITESPACE = 0x100
MAX_CODEPOINTS = 0x110000
WHITESPACE_CPTS = (*range(0x09, 0x0E), *range(0x2000, 0x200B), 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029,
                   0x202F, 0x205F, 0x3000)  # fmt: skip

# collapsed representation of non-ASCII codepoints (llama.cpp's k_ucat_cpt)
COLLAPSED = {NUMBER: 0xD1, LETTER: 0xD2, PUNCTUATION: 0xD3, MARK: 0xD4, SYMBOL: 0xD5}
COLLAPSED_OTHER = 0xD0
COLLAPSED_SPACE = 0x0B


@lru_cache(maxsize=1)
def flags_table() -> np.ndarray:
    """uint16[0x110000]: category flags | WHITESPACE for every codepoint."""
    from ._unicode_data import FLAG_RANGES

    starts = np.asarray(FLAG_RANGES[0::2], dtype=np.int64)
    values = np.asarray(FLAG_RANGES[1::2], dtype=np.uint16)
    lengths = np.diff(np.append(starts, MAX_CODEPOINTS))
    table = np.repeat(values, lengths)
    table[list(WHITESPACE_CPTS)] |= WHITESPACE
    return table


@lru_cache(maxsize=1)
def collapse_table() -> np.ndarray:
    """uint8[0x110001]: the collapsed byte of each codepoint (index 0x110000: out of range)."""
    fl = flags_table()
    out = np.full(MAX_CODEPOINTS + 1, COLLAPSED_OTHER, dtype=np.uint8)
    cat = fl[:MAX_CODEPOINTS] & 0xFF
    for flag, byte in COLLAPSED.items():
        out[:MAX_CODEPOINTS][cat == flag] = byte
    out[:MAX_CODEPOINTS][(fl & WHITESPACE) != 0] = COLLAPSED_SPACE
    out[:128] = np.arange(128, dtype=np.uint8)
    return out


# llama.cpp's unicode_cpt_is_han: the CJK ideograph blocks, [start, end)
HAN_RANGES = ((0x4E00, 0xA000), (0x3400, 0x4DC0), (0x20000, 0x2A6E0), (0x2A700, 0x2B740), (0x2B740, 0x2B820),
              (0x2B820, 0x2CEB0), (0x2CEB0, 0x2EBF0), (0xF900, 0xFB00), (0x2F800, 0x2FA20))  # fmt: skip
COLLAPSED_HAN = 0xD6  # a letter in those blocks
COLLAPSED_HAN_OTHER = 0xD7  # an unassigned codepoint in them (a Han run takes it, so does a punctuation run)


@lru_cache(maxsize=1)
def collapse_han_table() -> np.ndarray:
    """``collapse_table`` with the codepoints of ``HAN_RANGES`` apart (Kimi-K2's pre-tokenizer)."""
    out = collapse_table().copy()
    cat = flags_table() & 0xFF
    for a, b in HAN_RANGES:
        out[a:b] = np.where(cat[a:b] == LETTER, COLLAPSED_HAN, COLLAPSED_HAN_OTHER)
    return out


def codepoints(text: str) -> np.ndarray:
    """The codepoints of ``text`` as uint32 (lone surrogates kept)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def collapse(text: str) -> str:
    """One char per codepoint: ASCII as is, others by category (as llama.cpp's ``text_collapsed``)."""
    if text.isascii():
        return text
    cpts = np.minimum(codepoints(text), MAX_CODEPOINTS)
    return collapse_table()[cpts].tobytes().decode("latin-1")


def collapse_han(text: str) -> str:
    """``collapse`` with Han letters as ``COLLAPSED_HAN`` (unassigned codepoints of their blocks
    ``COLLAPSED_HAN_OTHER``)."""
    if text.isascii():
        return text
    cpts = np.minimum(codepoints(text), MAX_CODEPOINTS)
    return collapse_han_table()[cpts].tobytes().decode("latin-1")


def whitespace_to_vt(text: str) -> str:
    """Non-ASCII whitespace -> U+000B (what llama.cpp feeds std::wregex)."""
    if text.isascii():
        return text
    return text.translate(_WS_TO_VT)


_WS_TO_VT = {c: 0x0B for c in WHITESPACE_CPTS if c > 0x7F}


def cpt_flags(cpt: int) -> int:
    return int(flags_table()[cpt]) if 0 <= cpt < MAX_CODEPOINTS else UNDEFINED


# --- lenient UTF-8 decoding -----------------------------------------------------------------------


def _lenient_one(data: bytes, i: int) -> tuple[int, int] | None:
    """Decode one sequence at ``data[i]`` like llama.cpp's unicode_cpt_from_utf8: (cpt, length) or None."""
    n = len(data)
    b = data[i]
    if b < 0x80:
        return b, 1
    if not b & 0x40:
        return None
    if not b & 0x20:
        need, cpt = 1, b & 0x1F
    elif not b & 0x10:
        need, cpt = 2, b & 0x0F
    elif not b & 0x08:
        need, cpt = 3, b & 0x07
    else:
        return None
    if i + need >= n:
        return None
    for k in range(1, need + 1):
        c = data[i + k]
        if c & 0xC0 != 0x80:
            return None
        cpt = (cpt << 6) | (c & 0x3F)
    return cpt, need + 1


def _lenient_handler(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    data = exc.object
    res = _lenient_one(data, exc.start)
    if res is None or res[0] >= MAX_CODEPOINTS:
        return "\ufffd", exc.start + 1
    return chr(res[0]), exc.start + res[1]


codecs.register_error("llamapy-lenient", _lenient_handler)


def decode_utf8(data: bytes) -> str:
    """Bytes -> str as llama.cpp's unicode_cpts_from_utf8 (invalid bytes -> U+FFFD, one per byte).

    Codepoints above U+10FFFF (which llama.cpp cannot re-encode) also become U+FFFD per byte.
    """
    return data.decode("utf-8", "llamapy-lenient")


def encode_utf8(text: str) -> bytes:
    """str -> bytes; lone surrogates are encoded as their 3-byte forms (as llama.cpp would)."""
    return text.encode("utf-8", "surrogatepass")


# --- GPT-2 byte-level mapping ---------------------------------------------------------------------


def _byte_to_unicode() -> list[str]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out: list[str] = [""] * 256
    for b in keep:
        out[b] = chr(b)
    n = 0
    for b in range(256):
        if not out[b]:
            out[b] = chr(256 + n)
            n += 1
    return out


BYTE_TO_UNICODE: list[str] = _byte_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# bytes.translate cannot map to multi-byte output; a latin-1 round trip with str.translate can
_LATIN1_TO_BYTELEVEL = {b: BYTE_TO_UNICODE[b] for b in range(256)}


def byte_encode(text: str) -> str:
    """The GPT-2 byte-level form of ``text`` (its UTF-8 bytes, each mapped to one printable char)."""
    return encode_utf8(text).decode("latin-1").translate(_LATIN1_TO_BYTELEVEL)


@lru_cache(maxsize=1)
def _lower_map() -> dict[int, int]:
    from ._unicode_data import LOWERCASE

    return dict(zip(LOWERCASE[0::2], LOWERCASE[1::2], strict=True))


@lru_cache(maxsize=1)
def _nfd_map() -> dict[int, int]:
    from ._unicode_data import NFD_FIRST

    return dict(zip(NFD_FIRST[0::2], NFD_FIRST[1::2], strict=True))


def tolower(cpt: int) -> int:
    return _lower_map().get(cpt, cpt)


def nfd_first(cpt: int) -> int:
    """llama.cpp's per-codepoint NFD: the first codepoint of the decomposition."""
    return _nfd_map().get(cpt, cpt)
