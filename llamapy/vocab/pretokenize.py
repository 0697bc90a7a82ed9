"""BPE pre-tokenizers: llama.cpp's regex lists per ``tokenizer.ggml.pre`` and its splitting semantics.

llama.cpp does not run these regexes with full Unicode semantics. When a regex uses a category
(``\\p{L}``...), it runs on a *collapsed* text (each non-ASCII codepoint replaced by one byte standing
for its category, non-ASCII whitespace by U+000B) with ASCII-only classes; otherwise it runs on the
codepoints with non-ASCII whitespace replaced by U+000B. Unmatched stretches become words of their
own. ``split`` reproduces all of that with the ``regex`` package, so words match llama.cpp's exactly.
For a few regexes llama.cpp runs code of its own instead (Kimi-K2's splitter, the digit groups of
tiny_aya and AFMoE): ``_CUSTOM`` gives each as the same split by a regex over a view of the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from ..errors import LlamapyError
from . import unicode as U

# --- llama.cpp's regexes (llama-vocab.cpp, llm_tokenizer_bpe) ------------------------------------------
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
LLAMA3 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")  # fmt: skip
QWEN2 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
         "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")  # fmt: skip
QWEN35 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")  # fmt: skip
_DEEPSEEK_LETTERS = (
    "\\s?["
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370"
    "-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-"
    "\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-"
    "\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-"
    "\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a"
    "-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-"
    "\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-"
    "\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
    "\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-"
    "\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_DS3 = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")  # fmt: skip
# tiny_aya's words (llama.cpp reads \p{Lu}, \p{Ll}, ... as \p{L}: either letter alternative takes a whole run)
_TINY_AYA = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" + _CONTRACTIONS
          + "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" + _CONTRACTIONS
          + "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")  # fmt: skip
# llama.cpp's triggers of its hand-written splitters (unicode.cpp), and what ``split`` runs for each
KIMI_K2 = "\\p{Han}+"
AFMOE_DIGITS = "\\p{AFMoE_digits}"
TINY_AYA_DIGITS = "\\d{1,3}(?=(?:\\d{3})*\\b)"
_GPT4O = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_TEKKEN = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])"
    "([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_BLOOM = " ?[^(\\s|.,!?…。，、।۔،)]+"
NEWLINES = "[^\\n]+|[\\n]+"

REGEXES: dict[str, list[str]] = {
    "default": ["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"],
    "llama3": [LLAMA3],
    "deepseek-llm": ["[\r\n]", _DEEPSEEK_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$",
                     "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"],
    "deepseek3-llm": ["\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DS3],
    "deepseek-coder": ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"],
    "falcon": ["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"],
    "starcoder": ["\\p{N}", GPT2],
    "gpt2": [GPT2],
    "qwen2": [QWEN2],
    "qwen35": [QWEN35],
    "bloom": [_BLOOM],
    "chatglm4": [LLAMA3],
    "viking": [_BLOOM, "\\p{N}"],
    "tekken": [_TEKKEN],
    "gpt4o": [_GPT4O],
    "superbpe": ["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
    "bailingmoe": ["'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"],
    "seed-coder": [_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "ufakzeka": ["[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "minicpm5": ["\\p{N}{1,3}", _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "laguna": [NEWLINES, QWEN2],
    "gemma4": [NEWLINES],
    "whitespace": ["\\S+"],
    "tiny_aya": [TINY_AYA_DIGITS, _TINY_AYA],
    "kimi-k2": [KIMI_K2],
    "afmoe": [AFMOE_DIGITS, "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-"
              "\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af"
              "\u1100-\u11ff]+", _DS3],
}  # fmt: skip

# generated from llama.cpp's lists (C escapes decoded)
_MORE: dict[str, list[str]] = {
    'youtu': [
        '[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u3040-ゟ゠-ヿ]+',
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    'jais2': [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    ],
    'exaone-moe': [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ],
    'granite-emb-multi': [
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    'spark2_5': [
        '\\p{N}{1,3}',
        '[一-龥\u3040-ゟ゠-ヿ]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+',
        '\\p{N}',
    ],
    'chameleon': [
        '<sentinel:[0-9]+>',
        '(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z',
        '([\\t\\n]|    |  )',
        '\\p{N}',
        '[\\p{P}!-/:-@\\[-`{-~]',
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ],
}  # fmt: skip
REGEXES.update(_MORE)


@dataclass(frozen=True)
class PreTokenizer:
    """How a BPE vocabulary pre-tokenizes: llama.cpp's regex list and its vocab flags."""

    kind: str  # key of REGEXES
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None  # None: leave llama.cpp's default
    add_sep: bool | None = None
    escape_whitespaces: bool = False
    byte_encode: bool = True
    no_bos_id: bool = False  # chatglm: special_bos_id = NULL
    regexes: list[str] = field(default_factory=list)


def _pre(kind: str, **kw: object) -> PreTokenizer:
    return PreTokenizer(kind, regexes=REGEXES[kind], **kw)  # type: ignore[arg-type]


def _table() -> dict[str, PreTokenizer]:
    t: dict[str, PreTokenizer] = {}

    def add(names: str, pre: PreTokenizer) -> None:
        for n in names.split():
            t[n] = pre

    add("default", _pre("default"))
    add("minicpm5", _pre("minicpm5", ignore_merges=True))
    add(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        _pre("llama3", ignore_merges=True, add_bos=True),
    )
    add("deepseek-llm", _pre("deepseek-llm", clean_spaces=False))
    add("deepseek-coder", _pre("deepseek-coder", clean_spaces=False))
    add("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", _pre("deepseek3-llm", clean_spaces=False))
    add("falcon", _pre("falcon"))
    add("mpt olmo jais", _pre("gpt2"))
    add("starcoder refact codeshell exaone minerva-7b mellum2", _pre("starcoder"))
    add("command-r smollm", _pre("starcoder", clean_spaces=False))
    add(
        "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4",
        _pre("gpt2"),
    )
    add("jina-v1-en jina-v2-code roberta-bpe", _pre("gpt2", add_sep=True))
    add("gemma4 granite-embed-multi-311m", _pre("gemma4", escape_whitespaces=True, byte_encode=False))
    add("sarvam-moe", _pre("gemma4", escape_whitespaces=True, byte_encode=False, clean_spaces=False))
    add("whitespace", _pre("whitespace", byte_encode=False))
    add("qwen2 deepseek-r1-qwen kormo f2llmv2", _pre("qwen2", clean_spaces=False))
    add("stablelm2 megrez", _pre("qwen2"))
    add("qwen35", _pre("qwen35", clean_spaces=False))
    add("hunyuan solar-open grok-2", _pre("qwen2", clean_spaces=False))
    add("dbrx smaug-bpe", _pre("llama3"))
    add("poro-chat", _pre("bloom", clean_spaces=False))
    add("bloom gpt3-finnish", _pre("bloom"))
    add("chatglm-bpe", _pre("chatglm4", no_bos_id=True))
    add("glm4 glm5", _pre("chatglm4", no_bos_id=True, ignore_merges=True))
    add("viking", _pre("viking", clean_spaces=False))
    add("tekken", _pre("tekken", clean_spaces=False, ignore_merges=True, add_bos=True))
    add("gpt-4o llama4 kanana2 talkie minimax-m2", _pre("gpt4o", clean_spaces=False))
    add("superbpe", _pre("superbpe", clean_spaces=False))
    add("trillion granite-docling", _pre("gpt2", clean_spaces=False))
    add("bailingmoe bailingmoe2 llada-moe", _pre("bailingmoe", clean_spaces=False))
    add("seed-coder", _pre("seed-coder", clean_spaces=False))
    add("ufakzeka", _pre("ufakzeka", clean_spaces=False))
    add("laguna", _pre("laguna", clean_spaces=False))
    add("youtu", _pre("youtu", clean_spaces=False, ignore_merges=True))
    add("jais-2", _pre("jais2"))
    add("exaone-moe", _pre("exaone-moe"))
    add("tiny_aya cohere2moe", _pre("tiny_aya", clean_spaces=False))
    add("kimi-k2", _pre("kimi-k2", clean_spaces=False))
    add("afmoe", _pre("afmoe", clean_spaces=False))
    add("granite-embed-multi-97m", _pre("granite-emb-multi", clean_spaces=False, ignore_merges=True))
    add("spark2_5", _pre("spark2_5", clean_spaces=False))
    add("chameleon", _pre("chameleon", add_bos=True, clean_spaces=False))
    return t


PRE_TOKENIZERS = _table()


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value (missing or empty -> 'default')."""
    if not name:
        return PRE_TOKENIZERS["default"]
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        raise LlamapyError(
            f"tokenizer.ggml.pre: unknown or unsupported pre-tokenizer type {name!r}"
        ) from None


# --- splitting --------------------------------------------------------------------------------------------
_UCATS = {"\\p{N}": U.NUMBER, "\\p{L}": U.LETTER, "\\p{P}": U.PUNCTUATION, "\\p{M}": U.MARK, "\\p{S}": U.SYMBOL,
          "\\p{Lu}": U.LETTER, "\\p{Ll}": U.LETTER, "\\p{Lt}": U.LETTER, "\\p{Lm}": U.LETTER, "\\p{Lo}": U.LETTER}  # fmt: skip
_UCAT_ASCII = {U.NUMBER: "0-9", U.LETTER: "A-Za-z", U.PUNCTUATION: "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", U.MARK: "",
               U.SYMBOL: "\\$\\+<->\\^`\\|~"}  # fmt: skip


def _collapse_regex(expr: str) -> str:
    """Rewrite category classes for the collapsed text, as llama.cpp's unicode_regex_split does."""
    out: list[str] = []
    inside = False
    i = 0
    n = len(expr)
    while i < n:
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if c == "\\" and i + 3 < n and expr[i + 1] == "p" and expr[i + 2] == "{":
            close = expr.find("}", i + 3)
            if close != -1 and close <= i + 10 and expr[i : close + 1] in _UCATS:
                cat = _UCATS[expr[i : close + 1]]
                body = chr(U.COLLAPSED[cat]) + _UCAT_ASCII[cat]
                out.append(body if inside else "[" + body + "]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _rewrite(expr: str, swap: Callable[[str, int], str | None]) -> str:
    """``expr`` with ``swap(expr, i)``'s text in place of each character at ``i`` it answers for (only
    characters outside a character class and not escaped are asked)."""
    out: list[str] = []
    inside = escaped = False
    for i, c in enumerate(expr):
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == "[":
            inside = True
        elif c == "]":
            inside = False
        elif not inside and (text := swap(expr, i)) is not None:
            out.append(text)
            continue
        out.append(c)
    return "".join(out)


def _ecma_to_python(expr: str) -> str:
    """ECMAScript '$' (end of input only) -> '\\Z'; the rest of these regexes means the same in both."""
    return _rewrite(expr, lambda e, i: "\\Z" if e[i] == "$" else None)


def _no_capture(expr: str) -> str:
    """Make every group non-capturing (so that ``findall`` returns whole matches)."""
    return _rewrite(expr, lambda e, i: "(?:" if e[i] == "(" and not e.startswith("?", i + 1) else None)


@dataclass(frozen=True)
class _Compiled:
    """A pre-tokenizer regex as compiled, and the view of the text it runs on."""

    # the whole regex as one capturing group: ``split`` yields llama.cpp's gaps and matches in order
    pattern: Any  # re.Pattern, or regex.Pattern for what the stdlib engine rejects
    view: str  # the text it runs on: a key of _VIEWS


#: what a regex runs on: the codepoints (non-ASCII whitespace as U+000B), the collapsed text, or the
#: collapsed text with Han letters apart
_VIEWS: dict[str, Callable[[str], str]] = {
    "plain": U.whitespace_to_vt,
    "collapsed": U.collapse,
    "han": U.collapse_han,
}
_N, _L = "0-9\xd1", "A-Za-z\xd2"  # a number, a letter in the collapsed text
_HAN, _HAN_OTHER = chr(U.COLLAPSED_HAN), chr(U.COLLAPSED_HAN_OTHER)
#: llama.cpp runs code of its own (unicode.cpp) for these regexes; each is the same split as a regex over
#: a view. Digit groups (``unicode_regex_split_custom_afmoe``): a number run of n codepoints is cut after
#: its first n % 3 and then every 3; what precedes a run joins its first piece.
_CUSTOM: dict[str, tuple[str, str]] = {
    AFMOE_DIGITS: (
        f"[^{_N}]*(?:[{_N}]{{1,2}}(?=(?:[{_N}]{{3}})*(?![{_N}]))|[{_N}]{{3}})|[^{_N}]+",
        "collapsed",
    ),
    # Kimi-K2 (``unicode_regex_split_custom_kimi_k2``): its tokenizer's regex with Han runs apart and every
    # letter one class
    KIMI_K2: (
        f"[{_HAN}{_HAN_OTHER}]+|[^\r\n{_N}{_L}{_HAN}]?[{_L}]+{_CONTRACTIONS}?|[{_N}]{{1,3}}"
        f"| ?[^\\s{_N}{_L}{_HAN}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        "han",
    ),
}
_CUSTOM[TINY_AYA_DIGITS] = _CUSTOM[AFMOE_DIGITS]  # llama.cpp runs the same code for tiny_aya's digits


def compile_regexes(exprs: list[str]) -> list[_Compiled]:
    out = []
    for e in exprs:
        if e in _CUSTOM:
            rx, view = _CUSTOM[e]
            out.append(_Compiled(re.compile("(" + rx + ")", re.ASCII), view))
            continue
        use_collapsed = any(u in e for u in _UCATS)
        if use_collapsed and not e.isascii():
            raise LlamapyError(f"pre-tokenizer regex {e!r} mixes unicode categories and non-ASCII characters")
        src = "(" + _no_capture(_ecma_to_python(_collapse_regex(e) if use_collapsed else e)) + ")"
        try:  # the stdlib engine is faster on these plain patterns; both read them the same way
            pat: Any = re.compile(src, re.ASCII)
        except re.error:
            import regex

            pat = regex.compile(src, regex.ASCII | regex.V0)
        out.append(_Compiled(pat, "collapsed" if use_collapsed else "plain"))
    return out


def split(text: str, regexes: list[_Compiled]) -> list[str]:
    """Split ``text`` into words as llama.cpp's unicode_regex_split (before byte encoding).

    Empty matches (possible only with look-ahead-only regexes) give no word; they would give an empty
    word, hence no token, in llama.cpp.
    """
    if not text:
        return []
    words = [text]
    views: dict[str, str] = {}
    for rx in regexes:
        src = views.get(rx.view)
        if src is None:
            src = views[rx.view] = _VIEWS[rx.view](text)
        psplit = rx.pattern.split
        if src is text:
            new: list[str] = []
            for w in words:
                new.extend(psplit(w))
            words = [w for w in new if w]
        else:
            # run on the transformed text, cut the original at the same places
            new_lens: list[int] = []
            start = 0
            for w in words:
                n = len(w)
                new_lens.extend(map(len, psplit(src[start : start + n])))
                start += n
            words = []
            start = 0
            for n in new_lens:
                if n:
                    words.append(text[start : start + n])
                    start += n
    return words
