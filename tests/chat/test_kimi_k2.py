"""Kimi K2: detection and the prompt on the real templates, parsing in any split (ids kept), the grammar
and its lazy trigger, read back by the parser."""

from __future__ import annotations

import json
import re

import pytest

from llamapy.chat import detect_format
from llamapy.chat.kimi_k2 import KimiK2Format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

TEMPLATES = ("Kimi-K2-Instruct", "Kimi-K2-Thinking", "moonshotai-Kimi-K2")
S, SE, C, A, CE = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
WA, TA = '{"location": "Paris", "days": 3}', '{"timezone": "UTC"}'


def one(name: str, args: str, n: int = 0) -> str:
    return f"{C}functions.{name}:{n}{A}{args}{CE}"


def section(*calls: str) -> str:
    return S + "".join(calls) + SE


@pytest.mark.parametrize("name", TEMPLATES)
def test_detect(name):
    src = shared_path("templates", f"{name}.jinja").read_text()
    fmt = detect_format(src)
    assert fmt.name == "kimi-k2" and detect_format(src, tools_requested=False).name == "kimi-k2"
    assert (fmt.think is not None) == (name == "Kimi-K2-Thinking")
    out = ChatTemplate(src, "", "").render(CONVERSATION[:2], add_generation_prompt=True, tools=TOOLS)
    assert '"get_time"' in out and out.endswith("<|im_assistant|>assistant<|im_middle|>")


@pytest.mark.parametrize("name", TEMPLATES)
def test_prompt_with_calls(name):
    """Kimi-K2-Instruct's and -Thinking's templates queue tool call ids with list.append / pop."""
    src = shared_path("templates", f"{name}.jinja").read_text()
    fmt = detect_format(src)
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert one("get_weather", '{"location": "Paris"}') in out
    assert "functions.get_weather:0" in out and "22 degrees and sunny" in out and '"get_time"' in out


CASES = [
    (section(one("get_weather", WA)), ("", None, [("get_weather", json.loads(WA))]), ["functions.get_weather:0"]),
    ("Let me check." + section(one("get_weather", WA, 2), "\n", one("get_time", TA, 3)),
     ("Let me check.", None, [("get_weather", json.loads(WA)), ("get_time", json.loads(TA))]),
     ["functions.get_weather:2", "functions.get_time:3"]),
    ("<think>hmm</think>" + one("get_time", TA), ("", "hmm", [("get_time", json.loads(TA))]), None),
    (S + one("get_time", TA)[: -len(CE)], ("", None, [("get_time", json.loads(TA))]), None),  # cut off
    ("Plain text", ("Plain text", None, []), None),
    (S + C + "functions.f:0" + A + "[1]" + CE + SE, ("" + C + "functions.f:0" + A + "[1]" + CE, None, []), None),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected, ids = CASES[k]
    fmt = KimiK2Format("<think>")
    for pieces in ([text], list(text), [text[:20], text[20:]]):
        msg = run_pieces(fmt, pieces)
        assert summary(msg) == expected, pieces
        if ids is not None:
            assert [c.id for c in msg.tool_calls] == ids


def _trigger(g, text: str) -> int | None:
    kind, value = g.triggers[0]
    m = re.fullmatch(value, text) if kind == "pattern_full" else re.search(value, text)
    return m.start(1) if m else None


@pytest.mark.parametrize("source", ["", "<think>"])
def test_grammar(grammar_check, source):
    fmt = KimiK2Format(source)
    bad = section(one("get_weather", '{"location": "Paris", "days": "three"}'))
    for sp in (is_special, lambda t: None):
        g = fmt.grammar(TOOLS, "auto", True, sp)
        grammar_check.check(g)
        for ok in (
            section(one("get_weather", WA)),
            one("get_time", TA, 7),
            section(one("get_weather", WA), one("get_time", TA, 1)),
        ):
            assert grammar_check.match(g, ok, sp), ok
        assert not grammar_check.match(g, bad, sp)
        assert not grammar_check.match(g, section(one("get_stock", '{"symbol": "X"}')), sp)
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert not grammar_check.match(single, section(one("get_weather", WA), one("get_time", TA, 1)), sp)
        named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, sp)
        assert grammar_check.match(named, one("get_time", TA), sp)
        assert not grammar_check.match(named, one("get_weather", WA), sp)
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not grammar_check.match(req, "Hello", sp)
        if source:
            assert grammar_check.match(req, "<think>hmm</think>" + section(one("get_time", TA)), sp)
    g = fmt.grammar(TOOLS, "auto", True, is_special)
    assert _trigger(g, "Sure. " + section(one("get_time", TA))) == len("Sure. ")
    assert _trigger(g, "Sure. " + one("get_time", TA)) == len("Sure. ")
    if source:
        assert _trigger(g, "<think>maybe " + S + " no</think>OK") is None
