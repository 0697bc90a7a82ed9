"""Whitespace in every tool-call grammar is bounded (issue 33 §1): no grammar accepts a run of more than
``MAX_WS`` whitespace characters between its parts, and after a complete call without parallel calls
(or with a named tool) only the closing tag, one newline and end-of-generation may follow.

The families are found, not listed: every format ``detect_format`` gives for the real templates, plus the
formats of the other chat tests, and a test fails when a ``ChatFormat`` subclass that supports tools is
reached by none of them. Each family's grammars (auto, required, named, parallel or not, reasoning forced
open) are walked at random over the test vocabulary's tokens (bytes and special tokens), leaning towards
whitespace; at every position outside free text (string values, reasoning) runs of ``MAX_WS + 1``
whitespace characters of several shapes must be refused.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator

import pytest

from llamapy.chat import ChatFormat, ToolGrammar, detect_format
from llamapy.chat.common import MAX_WS, WS_PATTERN
from tests.chat.conftest import EOS, SPECIAL_TOKENS, TOOLS, is_special, tokenize
from tests.chat.test_grammars import FAMILIES as GRAMMAR_FAMILIES
from tests.chat.test_json_tags import FAMILIES as JSON_TAGS_FAMILIES
from tests.chat.test_json_tags import fmt_of as json_tags_format
from tests.util import SHARED, shared_path

N_VOCAB = 256 + len(SPECIAL_TOKENS)
EOS_ID = 256 + SPECIAL_TOKENS.index(EOS)
WS_BYTES = tuple(b" \t\n\r")
CLOSERS = tuple(b"}]")  # the walk leans towards closing JSON, so that calls end
NAMED = {"type": "function", "function": {"name": "get_time"}}
# (tool_choice, parallel_tool_calls, thinking_forced_open); a named choice is never parallel
VARIANTS = {
    "auto": ("auto", True, False),
    "auto-single": ("auto", False, False),
    "required": ("required", True, False),
    "required-single": ("required", False, False),
    "named": (NAMED, True, False),
    "required-forced-open": ("required", False, True),
}
SINGLE = {"auto-single", "required-single", "named", "required-forced-open"}
# runs one character over the bound, of the shapes a grammar could let through
PROBES = [
    " " * (MAX_WS + 1),
    "\n" * (MAX_WS + 1),
    "\t" * (MAX_WS + 1),
    "\r" * (MAX_WS + 1),
    "\r\n" * (MAX_WS // 2 + 1),
    "\n" + " " * MAX_WS,
    "\n\n" + " " * (MAX_WS - 1),
    "\n\n" + "\t" * (MAX_WS - 1),
    " \n\n" + " " * (MAX_WS - 2),
    "\n" * 3 + " " * (MAX_WS - 2),
]
PROBE_TOKENS = [list(p.encode()) for p in PROBES]
# after the first complete call of a single-call grammar: whitespace, one closing tag, one newline
AFTER_CALL = re.compile(rf"(?:[ \t\r\n]{{0,{MAX_WS}}}\S{{1,40}})?\n?")


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _all_formats() -> list[ChatFormat]:
    """One format per distinct tool grammar: the real templates' and the other chat tests' formats."""
    found: list[ChatFormat] = [f for f, *_ in GRAMMAR_FAMILIES.values()]
    found += [json_tags_format(name, think) for name in sorted(JSON_TAGS_FAMILIES) for think in (True, False)]
    for path in sorted((SHARED / "templates").glob("*.jinja")):
        found.append(detect_format(path.read_text(encoding="utf-8")))
    for cls in _subclasses(ChatFormat):
        try:
            found.append(cls())
        except TypeError:  # needs arguments: reached through the templates or the tests' tables
            pass
    out, seen = [], set()
    for fmt in found:
        if not fmt.supports_tools:
            continue
        key = (type(fmt).__name__, fmt.grammar(TOOLS, "required", True, is_special).lark)
        if key not in seen:
            seen.add(key)
            out.append(fmt)
    return out


FORMATS = _all_formats()
IDS = [f"{k}-{type(f).__name__}-{f.name}" for k, f in enumerate(FORMATS)]


def test_every_family_is_covered():
    shared_path("templates")  # (the real templates reach most families)
    covered = {type(f) for f in FORMATS}
    missing = [c.__name__ for c in _subclasses(ChatFormat) if c.supports_tools and c not in covered]
    assert not missing, f"no format instance for {missing}: add a template or a test table entry"


def test_bound_is_llama_cpp_space_and_json_whitespace():
    from llamapy.grammar.grammar import JSON_WHITESPACE

    assert WS_PATTERN == JSON_WHITESPACE
    assert MAX_WS == 22
    ws = re.compile(WS_PATTERN)
    assert ws.fullmatch(" ") and ws.fullmatch("\n\n" + "\t" * 20)
    assert not ws.fullmatch("  ") and not ws.fullmatch("\n\n\n") and not ws.fullmatch("\n" + " " * 21)


# --- walking a grammar ---


def _hints(lark: str) -> list[list[int]]:
    """Texts that leave free text: the grammar's literals (outside its JSON schemas), the ends of its lazy
    regexes, its special tokens, and a JSON string's closing quote."""
    lark = re.sub(r"%json .*", "", lark)
    texts = {'"'}
    for lit in re.findall(r'"(?:[^"\\\n]|\\.)*"', lark):
        try:
            texts.add(json.loads(lit))
        except ValueError:
            pass
    for end in re.findall(r"/\(\?s:\.\*\)((?:[^/\\]|\\.)+)/", lark):
        texts.add(re.sub(r"\\(.)", r"\1", end))
    out = [tokenize(t) for t in sorted(texts) if t]
    out += [[int(i)] for i in sorted(set(re.findall(r"<\[(\d+)\]>", lark)))]
    return out


def _allowed(m) -> list[int]:
    bits = m.compute_bitmask()
    return [i for i in range(N_VOCAB) if bits[i >> 3] >> (i & 7) & 1]


def _is_free(allowed: list[int]) -> bool:
    """Free text (a string value, reasoning, raw code): most printable characters may come next."""
    return sum(1 for t in allowed if 0x21 <= t <= 0x7E) >= 60


def _leaves_free(m, tokens: list[int]) -> bool:
    assert m.consume_tokens(tokens)
    leaves = not _is_free(_allowed(m))
    m.rollback(len(tokens))
    return leaves


def _text(tokens: list[int]) -> str:
    return b"".join(bytes([t]) if t < 256 else SPECIAL_TOKENS[t - 256].encode() for t in tokens).decode(
        "utf-8", "replace"
    )


class Walk:
    """One random walk; ``ws_max`` is the longest whitespace run taken outside free text, ``accepted_at``
    the number of tokens at the first complete sentence reached outside free text (None: never)."""

    def __init__(self, m, rng: random.Random, hints: list[list[int]], single: bool, steps: int = 800):
        self.tokens: list[int] = []
        self.ws_max = 0
        self.accepted_at: int | None = None
        self.stopped = False
        run = 0
        free_run = 0
        while steps > 0:
            steps -= 1
            allowed = _allowed(m)
            if m.is_stopped() or allowed == [EOS_ID]:
                self.stopped = True
                return
            free = _is_free(allowed)
            if not free:
                for probe, toks in zip(PROBES, PROBE_TOKENS, strict=True):
                    n = m.validate_tokens(toks)
                    assert n <= MAX_WS, f"{probe!r} accepted ({n} tokens) after {_text(self.tokens)!r}"
                if m.is_accepting() and self.accepted_at is None:
                    assert EOS_ID in allowed, "complete but end-of-generation not allowed"
                    self.accepted_at = len(self.tokens)
                    steps = max(steps, MAX_WS + 60)  # room to reach the end from here
            choices = [t for t in allowed if t != EOS_ID]
            if EOS_ID in allowed and not single and rng.random() < 0.3:
                self.stopped = True
                return
            ws = [t for t in choices if t in WS_BYTES]
            take: list[int]
            if free:
                free_run += 1
                fits = [h for h in hints if m.validate_tokens(h) == len(h)]
                if free_run > 12:  # long enough: leave the free text where a hint does
                    fits = [h for h in fits if _leaves_free(m, h)] or fits
                if fits and (free_run > 12 or rng.random() < 0.3):
                    take = rng.choice(fits)
                else:
                    take = [rng.choice([t for t in choices if t < 128] or choices)]
            else:
                free_run = 0
                closers = [t for t in choices if t in CLOSERS]
                r = rng.random()
                pool = ws if ws and r < 0.6 else closers if closers and r < 0.8 else choices
                take = [rng.choice(pool)]
            assert m.consume_tokens(take), m.get_error()
            self.tokens += take
            if not free and len(take) == 1 and take[0] in WS_BYTES:
                run += 1
                self.ws_max = max(self.ws_max, run)
            else:
                run = 0


def _grammars(fmt: ChatFormat) -> Iterator[tuple[str, ToolGrammar]]:
    for name, (choice, parallel, forced) in VARIANTS.items():
        if forced and fmt.think is None:
            continue
        yield name, fmt.grammar(TOOLS, choice, parallel, is_special, thinking_forced_open=forced)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_whitespace_bounded_and_calls_end(lltokenizer, fmt):
    import llguidance

    for variant, g in _grammars(fmt):
        compiled = llguidance.LLMatcher.grammar_from_lark(g.lark)
        proto = llguidance.LLMatcher(lltokenizer, compiled, log_level=0)
        assert not proto.is_error(), proto.get_error()
        hints = _hints(g.lark)
        single = variant in SINGLE
        completed = 0
        for seed in range(6):
            w = Walk(proto.deep_copy(), random.Random(seed), hints, single)
            assert w.ws_max <= MAX_WS, (variant, _text(w.tokens))
            if w.accepted_at is None:
                continue
            completed += 1
            if single:
                after = _text(w.tokens[w.accepted_at :])
                assert w.stopped, f"{variant}: no end after a complete call: {_text(w.tokens)!r}"
                assert AFTER_CALL.fullmatch(after), f"{variant}: {after!r} after a complete call"
        assert completed, f"{variant}: no walk completed a call\n{g.lark}"


# --- the case, exactly ---


def _matcher(lltokenizer, g: ToolGrammar):
    import llguidance

    return llguidance.LLMatcher(lltokenizer, llguidance.LLMatcher.grammar_from_lark(g.lark), log_level=0)


@pytest.mark.parametrize("parallel", [False, True])
def test_space_after_the_call_cannot_repeat(lltokenizer, parallel):
    """Qwen2.5-Coder's transcript: after ``"Paris"}}`` a space, and another, until max_tokens."""
    from llamapy.chat.hermes import HermesFormat

    g = HermesFormat("<tool_call>").grammar(TOOLS, "required", parallel, is_special)
    m = _matcher(lltokenizer, g)
    assert m.consume_tokens(
        tokenize('<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}')
    )
    assert m.consume_tokens(tokenize(" "))
    assert m.validate_tokens(tokenize(" ")) == 0, "a second space after the call"
    assert m.consume_tokens(tokenize("</tool_call>"))
    assert EOS_ID in _allowed(m)
    if not parallel:  # only one newline, then only the end
        assert m.validate_tokens(tokenize(" ")) == 0
        assert m.consume_tokens(tokenize("\n"))
        assert _allowed(m) == [EOS_ID]
    else:  # a second call may follow a short run, a long run may not
        assert m.validate_tokens(tokenize(" <tool_call>")) == 2
        assert m.validate_tokens(tokenize(" " * (MAX_WS + 1))) == 1


def test_named_choice_is_one_call(grammar_check):
    from llamapy.chat.hermes import HermesFormat

    call = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call>'
    g = HermesFormat("<tool_call>").grammar(TOOLS, NAMED, True, is_special)
    assert grammar_check.match(g, call) and grammar_check.match(g, call + "\n")
    assert not grammar_check.match(g, call + "\n" + call)


def test_json_arguments_take_no_invented_keys(grammar_check):
    """A schema that lists ``properties`` gets ``additionalProperties: false`` (as llama.cpp and
    ``LlamaGrammar.from_json_schema``); the request's tools are not changed."""
    from llamapy.chat.hermes import HermesFormat

    tools = json.loads(json.dumps(TOOLS))
    g = HermesFormat("<tool_call>").grammar(tools, "required", False, is_special)
    assert tools == TOOLS
    ok = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call>'
    assert grammar_check.match(g, ok)
    assert not grammar_check.match(g, ok.replace('"UTC"}', '"UTC", "weather_morning": 1}'))
    assert not grammar_check.match(g, ok.replace('": "UTC"', '":  "UTC"')), "two spaces inside the JSON"
