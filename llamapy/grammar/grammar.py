r"""``LlamaGrammar`` (llama-cpp-python's name): GBNF, llguidance Lark, a JSON schema or a regex, compiled
for llguidance; ``Trigger``: when a lazy grammar starts constraining.

- GBNF goes through llamapy's converter (:mod:`.gbnf`, :mod:`.lark_writer`): llama.cpp's syntax and
  meaning, ``<[id]>``/``<token>`` references and ``!`` negations, errors with line and column. Unlike
  llama.cpp it accepts left recursion (llguidance parses with Earley), ``_`` in rule names, and refuses
  a grammar that matches nothing; alternatives that can never complete are dropped. A literal such as
  ``"<think>"`` is text: a special token is only matched by ``<think>``/``<[id]>`` (llguidance's rule).
- A string that starts with ``%llguidance`` is llguidance Lark, passed as is (also ``from_lark``).
- JSON schemas use llguidance's compiler. Unsupported keywords are refused, not ignored (no ``lenient``;
  a schema's own ``x-guidance`` options are honoured). ``true`` and ``{}`` allow any JSON value, as
  JSON Schema says (llama.cpp reads ``{}`` as any object). Whitespace is llama.cpp's ``SPACE`` (nothing,
  one space, or one or two newlines and up to 20 spaces or tabs) at each place JSON allows it, so a
  model cannot loop on whitespace. ``additionalProperties`` defaults to false where a schema lists
  ``properties`` and says nothing about other ones, as llama.cpp's json-schema-to-grammar does ("default
  to false for generation, even though the spec says true"); where such an object is merged with others
  (``allOf``, ``$ref`` with siblings, ``anyOf``/``oneOf`` next to other keywords, ``not``, ``if``) the
  default is llguidance's (JSON Schema's: allowed). Either way the output validates against the schema.
  In strings the model may write ``\uXXXX`` only for control characters (llguidance's JSON); every other
  character is written as itself, where llama.cpp's grammars also allow any ``\uXXXX`` escape.
- Regexes are Rust ``regex`` syntax (``\d`` is any Unicode digit), matched against the whole output.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from llguidance import LLMatcher

from .._dataclass import dataclass
from .errors import GrammarError
from .gbnf import parse_gbnf
from .lark_writer import Converted, bind_tokens, gbnf_lark
from .limits import check_regex, run_deep
from .limits_rules import check_gbnf, check_lark
from .limits_schema import check_schema
from .tokenizer import VocabInfo, vocab_info

if TYPE_CHECKING:
    from .sampler import GrammarSampler

log = logging.getLogger(__name__)

#: llama.cpp's ``SPACE`` rule of json-schema-to-grammar: ``| " " | "\n"{1,2} [ \t]{0,20}``
JSON_WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})"
JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}
_MAX_MESSAGE = 2000


def parser_limits() -> llguidance.LLParserLimits:
    """llguidance's limits for every grammar: its defaults, with a quarter of the lexer states (memory) and
    40 times the Earley items a mask may visit. A grammar whose free text cannot be one lexeme (recursive
    or ambiguous rules around ``[^...]+``: s-expressions, nested lists, XML-like text) is written one
    character a lexeme, and its mask walks the parser over every vocabulary token's bytes: at the default
    of 50k items such grammars failed after a few tokens (``(a``, ``<a>``; llama.cpp follows them), at
    500k an XML-like text still failed after 20 tokens; with 2M its masks took 81 ms on average, 300 ms at
    most, on a 128k vocabulary (``benchmarks/grammar_vs_llamacpp.py``; plain grammars stay far below)."""
    return llguidance.LLParserLimits(max_lexer_states=60_000, step_max_items=2_000_000, verbose_errors=True)


def _short(msg: str) -> str:
    msg = msg.strip()
    return msg if len(msg) <= _MAX_MESSAGE else msg[:_MAX_MESSAGE] + " ..."


TRIGGER_KINDS = ("word", "pattern", "pattern_full", "token")


@lru_cache(maxsize=256)
def compile_trigger(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise GrammarError(f"grammar trigger pattern {pattern!r} is not a valid regex: {e}") from e


@dataclass(frozen=True)
class Trigger:
    """A lazy grammar's activation condition (llama.cpp's ``common_grammar_trigger``).

    ``kind``: "word" (literal text anywhere in the output), "pattern" (Python regex searched anywhere),
    "pattern_full" (regex that must match the whole output so far), "token" (a token id). The grammar
    starts at the word, at the first capture group that matched non-empty text (else at the match), or
    at the token.
    """

    kind: str
    value: str | int

    def __post_init__(self) -> None:
        if self.kind not in TRIGGER_KINDS:
            raise GrammarError(
                f"grammar trigger kind {self.kind!r}: expected one of {', '.join(TRIGGER_KINDS)}"
            )
        if self.kind == "token":
            if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
                raise GrammarError(f"token trigger: expected a token id (int >= 0), got {self.value!r}")
            return
        if not isinstance(self.value, str) or not self.value:
            raise GrammarError(f"{self.kind} trigger: expected a non-empty string, got {self.value!r}")
        if self.kind != "word":
            compile_trigger(self.value)


class LlamaGrammar:
    """A grammar for constrained sampling; build with the ``from_*`` class methods, then ``sampler(vocab)``.

    ``source``: what was given; ``kind``: "gbnf", "lark", "json_schema" or "regex"; ``triggers``: empty
    unless the grammar is lazy (see :meth:`lazy`). Syntax errors are raised by the constructors; errors
    that need the vocabulary (token references) by :meth:`check` and :meth:`sampler`.
    """

    def __init__(self, source: str, kind: str, lark: str | Converted, verbose: bool = True) -> None:
        self.source = source
        self.kind = kind
        self.triggers: tuple[Trigger, ...] = ()
        self.verbose = verbose
        self._lark = lark  # llguidance grammar text, or GBNF Lark whose <token> references need a vocabulary
        self._bound: weakref.WeakKeyDictionary[Any, LLMatcher] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        run_deep(lambda: self._validate(self._text(None), None))  # llguidance recurses: see .limits

    def __repr__(self) -> str:
        src = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        lazy = f", triggers={list(self.triggers)!r}" if self.triggers else ""
        return f"LlamaGrammar(kind={self.kind!r}, source={src!r}{lazy})"

    # --- constructors ---

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """llama.cpp GBNF (start rule ``root``); a string starting with ``%llguidance`` is llguidance Lark."""
        if not isinstance(grammar, str):
            raise GrammarError(f"grammar: expected a string, got {type(grammar).__name__}")
        if grammar.lstrip().startswith("%llguidance"):
            check_lark(grammar)
            return cls(grammar, "lark", run_deep(LLMatcher.grammar_from_lark, grammar), verbose)
        parsed = parse_gbnf(grammar)
        check_gbnf(parsed)
        conv = gbnf_lark(parsed)
        lark: str | Converted = conv if conv.tokens else LLMatcher.grammar_from_lark(conv.lark)
        return cls(grammar, "gbnf", lark, verbose)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        """``from_string`` on the contents of a UTF-8 file."""
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise GrammarError(f"cannot read grammar file {os.fspath(file)!r}: {e}") from e
        return cls.from_string(text, verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str | dict[str, Any], verbose: bool = True) -> LlamaGrammar:
        """Output that validates against ``json_schema`` (JSON text, a dict, or a boolean schema)."""
        if isinstance(json_schema, (bytes, bytearray)):
            json_schema = json_schema.decode("utf-8", "replace")
        if isinstance(json_schema, str):
            source = json_schema
            try:
                schema = json.loads(json_schema)
            except json.JSONDecodeError as e:
                raise GrammarError(
                    f"JSON schema is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
                ) from e
            except RecursionError as e:
                raise GrammarError("JSON schema is nested too deeply") from e
        else:
            schema = json_schema
            source = ""
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        if schema is False:
            raise GrammarError("JSON schema false: no value is valid, nothing can be generated")
        if schema is True:
            schema = {}  # any JSON value
        try:
            text = json.dumps(schema)
            prepared = json.loads(text)
        except RecursionError as e:
            raise GrammarError("JSON schema is nested too deeply") from e
        except (TypeError, ValueError) as e:
            raise GrammarError(f"JSON schema cannot be written as JSON: {e}") from e
        default_no_additional_properties(prepared)
        check_schema(prepared)
        try:
            g = run_deep(_from_json_schema, json.dumps(prepared))
        except (ValueError, RecursionError) as e:
            raise GrammarError(f"JSON schema: {e}") from e
        return cls(source or text, "json_schema", g, verbose)

    @classmethod
    def from_lark(cls, lark: str) -> LlamaGrammar:
        """llguidance's Lark dialect (``start`` rule; see llguidance's docs/syntax.md)."""
        if not isinstance(lark, str):
            raise GrammarError(f"lark grammar: expected a string, got {type(lark).__name__}")
        check_lark(lark)
        return cls(lark, "lark", run_deep(LLMatcher.grammar_from_lark, lark))

    @classmethod
    def from_regex(cls, regex: str) -> LlamaGrammar:
        """Output that matches ``regex`` entirely (Rust ``regex`` syntax)."""
        if not isinstance(regex, str):
            raise GrammarError(f"regex grammar: expected a string, got {type(regex).__name__}")
        check_regex(regex, "regex grammar")
        return cls(regex, "regex", run_deep(LLMatcher.grammar_from_regex, regex))

    @classmethod
    def json_object(cls) -> LlamaGrammar:
        """Any JSON object (``response_format`` ``json_object`` without a schema)."""
        return cls.from_json_schema({"type": "object"})

    def lazy(self, triggers: Sequence[Trigger]) -> LlamaGrammar:
        """A copy that constrains nothing until one of ``triggers`` fires."""
        trig = tuple(triggers)
        if not trig:
            raise GrammarError("a lazy grammar needs at least one trigger")
        for t in trig:
            if not isinstance(t, Trigger):
                raise GrammarError(f"grammar trigger: expected a Trigger, got {t!r}")
        g = object.__new__(LlamaGrammar)
        g.__dict__.update(self.__dict__)  # shares the compiled grammar and its per-vocabulary cache
        g.triggers = trig
        return g

    # --- vocabulary-bound checks ---

    def check(self, vocab: Any = None) -> None:
        """Validate (with the model's tokenizer when ``vocab`` is given); GrammarError with the message."""
        if vocab is None:
            run_deep(lambda: self._validate(self._text(None), None))
        else:
            self.matcher(vocab)

    def sampler(self, vocab: Any) -> GrammarSampler:
        """A :class:`GrammarSampler` of this grammar for ``vocab``."""
        from .sampler import GrammarSampler

        return GrammarSampler(self, vocab)

    def matcher(self, vocab: Any) -> LLMatcher:
        """A fresh ``LLMatcher`` of this grammar for ``vocab`` (validated; compiled once per vocabulary)."""
        try:
            with self._lock:
                proto = self._bound.get(vocab)
        except TypeError:  # vocabulary not weakly referenceable: no cache
            proto = None
        if proto is None:
            proto = run_deep(self._compile, vocab)
            try:
                with self._lock:
                    self._bound[vocab] = proto
            except TypeError:
                pass
        with self._lock:
            return proto.deep_copy()

    def _what(self) -> str:
        return {"gbnf": "GBNF grammar", "lark": "Lark grammar", "json_schema": "JSON schema"}.get(
            self.kind, "regex grammar"
        )

    def _text(self, info: VocabInfo | None, vocab: Any = None) -> str:
        if isinstance(self._lark, str):
            return self._lark
        if info is None:
            return LLMatcher.grammar_from_lark(bind_tokens(self._lark, lambda text: 0))

        def resolve(text: str | int) -> int:
            if isinstance(text, int):
                if text >= info.n_vocab:
                    raise GrammarError(
                        f"GBNF grammar: token reference <[{text}]> is out of range: this vocabulary has "
                        f"{info.n_vocab} tokens"
                    )
                return text
            t = info.special.get(text)
            if t is not None:
                return t
            ids = list(vocab.tokenize(text, add_special=False, parse_special=True))
            if len(ids) != 1:
                raise GrammarError(
                    f"GBNF grammar: token reference {text} is not one token of this vocabulary "
                    f"(it tokenizes to {ids[:8]})"
                )
            return int(ids[0])

        return LLMatcher.grammar_from_lark(bind_tokens(self._lark, resolve))

    def _validate(self, text: str, info: VocabInfo | None) -> None:
        tok = info.tokenizer if info is not None else None
        try:
            is_err, msgs = LLMatcher.validate_grammar_with_warnings(text, tok, limits=parser_limits())
        except (ValueError, RuntimeError) as e:  # API misuse reported by llguidance itself
            raise GrammarError(f"{self._what()}: {e}") from e
        if is_err:
            raise GrammarError(f"{self._what()}: {_short(msgs[0] if msgs else 'invalid')}")
        if self.verbose:
            for m in msgs:
                if "no tokenizer" not in m:
                    log.warning("%s: %s", self._what(), _short(m))

    def _compile(self, vocab: Any) -> LLMatcher:
        info = vocab_info(vocab)
        text = self._text(info, vocab)
        self._validate(text, info)
        m = LLMatcher(info.tokenizer, text, log_level=0, limits=parser_limits())
        if m.is_error():
            raise GrammarError(f"{self._what()}: {_first_mask_error(m.get_error())}")
        # llguidance builds its parser lazily: the first mask is where a grammar that can produce nothing
        # (a $ref cycle with no way out) or one too ambiguous to follow fails; fail here, not while sampling
        mask = np.zeros((info.n_vocab + 31) // 32, dtype=np.int32)
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if m.is_error():
            raise GrammarError(f"{self._what()}: {_first_mask_error(m.get_error())}")
        if not mask.any() and not m.is_accepting():
            raise GrammarError(f"{self._what()}: no text can match it (no token is allowed at the start)")
        return m


def _from_json_schema(text: str) -> str:
    return LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)


def _first_mask_error(err: str) -> str:
    """llguidance's error at the first mask, without its dump of the parser state."""
    msg = err.split("<state>", 1)[0].strip() or err.strip()
    if "NoExtensionBias" in msg:
        return "no text can match it (each way through it needs more of itself, e.g. a $ref cycle with no way out)"
    if "lexer precomputation failed" in msg:
        return "too complex for llguidance's lexer (its initial_lexer_fuel ran out: too many optional parts in a row?)"
    if "Too many items" in msg:
        return f"too ambiguous to follow ({msg}); use fewer rules that can be empty, or longer lexemes"
    return "it cannot be followed: " + _short(msg)


# --- additionalProperties: false by default, as llama.cpp ----------------------------------------------------

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_SCHEMA_LISTS = ("prefixItems", "items")
_ANNOTATIONS = {"$anchor", "$schema", "$id", "id", "$comment", "title", "description", "default", "readOnly",
                "writeOnly", "examples", "contentMediaType", "contentEncoding", "deprecated", "x-guidance"}  # fmt: skip
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_MERGING = ("allOf", "anyOf", "oneOf", "$ref", "not", "if", "then", "else")


def default_no_additional_properties(schema: Any) -> None:
    """Set ``additionalProperties: false`` (in place) on plain object schemas that list ``properties``."""
    if not isinstance(schema, dict):
        return
    nodes: list[tuple[dict, str, bool]] = []  # (schema, JSON pointer, merged with others)
    stack: list[tuple[Any, str, bool]] = [(schema, "#", False)]
    ref_use: dict[str, bool] = {}  # ref -> only used plainly
    while stack:
        node, ptr, merged = stack.pop()
        if not isinstance(node, dict):
            continue
        nodes.append((node, ptr, merged))
        ref = node.get("$ref")
        own = [k for k in node if k not in _ANNOTATIONS and k not in ("$defs", "definitions")]
        if ref is not None:  # beside its definitions only (pydantic's root of a recursive model): plain
            plain = not merged and own == ["$ref"]
            ref_use[str(ref)] = ref_use.get(str(ref), True) and plain
        for key in _SCHEMA_MAPS:
            sub = node.get(key)
            if isinstance(sub, dict):
                for name, s in sub.items():
                    defs = key in ("$defs", "definitions")
                    stack.append((s, f"{ptr}/{_escape(key)}/{_escape(name)}", merged and not defs))
        for key in _SCHEMA_ONE:
            stack.append((node.get(key), f"{ptr}/{key}", merged))
        for key in _SCHEMA_LISTS:
            sub = node.get(key)
            if isinstance(sub, list):
                for i, s in enumerate(sub):
                    stack.append((s, f"{ptr}/{key}/{i}", merged))
        for key in ("allOf", "anyOf", "oneOf"):
            sub = node.get(key)
            if isinstance(sub, list):
                # allOf members are merged; anyOf/oneOf members are merged when the node has other keywords
                m = key == "allOf" or len(own) > 1 or merged
                for i, s in enumerate(sub):
                    stack.append((s, f"{ptr}/{key}/{i}", m))
        for key in ("not", "if", "then", "else"):
            stack.append((node.get(key), f"{ptr}/{key}", True))
    if any(not r.startswith("#") for r in ref_use):
        return  # references we cannot follow: do not guess which objects are merged
    for node, ptr, merged in nodes:
        if merged or not isinstance(node.get("properties"), dict):
            continue
        if any(k in node for k in _OPEN_KEYS) or any(k in node for k in _MERGING):
            continue
        typ = node.get("type", "object")
        if typ != "object" and not (isinstance(typ, list) and "object" in typ):
            continue
        merged_refs = [r.rstrip("/") for r, plain in ref_use.items() if not plain]
        if any(r == "#" or ptr == r or ptr.startswith(r + "/") for r in merged_refs):
            continue  # this object, or one around it, is merged with others through a $ref
        node["additionalProperties"] = False


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")
