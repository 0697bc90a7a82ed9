"""GLM 4.5-4.7 / Ling 3.0 ``<arg_key>`` calls: detection and the prompt on the real templates, parsing
in any split, the grammar (typed values, lazy trigger outside reasoning), read back by the parser."""

from __future__ import annotations

import json
import re

import pytest

from llamapy.chat import detect_format
from llamapy.chat.glm import GlmFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

TEMPLATES = (
    "GLM-4.6",
    "GLM-4.7-Flash",
    "inclusionai-ling-3.0-flash",
    "Spark2.5",
    "poolside-Laguna-S-2.1",
    "poolside-Laguna-XS-2.1",
    "poolside-Laguna-XS.2",
)


def _source(name: str) -> str:
    return shared_path("templates", f"{name}.jinja").read_text()


def call(name: str, *kv: tuple[str, str], nl: bool = True) -> str:
    sep = "\n" if nl else ""
    args = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in kv)
    return f"<tool_call>{name}{sep}{args}</tool_call>"


WEATHER = call("get_weather", ("location", "Paris"), ("days", "3"))
TIME = call("get_time", ("timezone", "UTC"), nl=False)


@pytest.mark.parametrize("name", TEMPLATES)
def test_detect_and_prompt(name):
    src = _source(name)
    fmt = detect_format(src)
    assert fmt.name == "glm-4.5" and detect_format(src, tools_requested=False).name == "glm-4.5"
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert "<tool_call>get_weather" in out and "<arg_key>location</arg_key>" in out
    assert "<arg_value>Paris</arg_value>" in out and "22 degrees and sunny" in out
    assert '"get_time"' in out  # the tool list


CASES = [
    (WEATHER, ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("Sure." + WEATHER + TIME, ("Sure.", None, [
        ("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])),
    ("<think>hmm <tool_call> no</think>\n" + call("get_weather", ("location", "42"), nl=False),
     ("", "hmm <tool_call> no", [("get_weather", {"location": "42"})])),  # string schema: stays a string
    (call("f", ("a", '{"x": [1, 2]}'), ("b", "not json"), ("c", "\n line\n")),
     ("", None, [("f", {"a": {"x": [1, 2]}, "b": "not json", "c": "\n line\n"})])),
    ("<tool_call>read_file</tool_call>", ("", None, [("read_file", {})])),
    ("<tool_call>get_time<arg_key>timezone</arg_key><arg_value>UTC</arg_value>",
     ("", None, [("get_time", {"timezone": "UTC"})])),  # the end tag cut off by the stop
    ("I write <tool_call> tags", ("I write <tool_call> tags", None, [])),
    ("<tool_call>f<arg_key>a</arg_key>oops</tool_call>", ("<tool_call>f<arg_key>a</arg_key>oops</tool_call>", None, [])),
    ("<tool_call>f<arg_key>a</arg_key><arg_value>open", ("<tool_call>f<arg_key>a</arg_key><arg_value>open", None, [])),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = GlmFormat()
    known = {t["function"]["name"] for t in TOOLS}
    tools = TOOLS if all(name in known for name, _ in expected[2]) else None
    for pieces in ([text], list(text), [text[: len(text) // 3], text[len(text) // 3 :]]):
        assert summary(run_pieces(fmt, pieces, tools=tools)) == expected, pieces
    if tools is None and expected[2]:  # a name that is not one of the request's tools: not a call
        assert not run_pieces(fmt, [text], tools=TOOLS).tool_calls


def test_forced_open():
    src = _source("GLM-4.7-Flash")
    fmt = detect_format(src)
    prompt = ChatTemplate(src, "", "").render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert fmt.thinking_forced_open(prompt)
    msg = run_pieces(fmt, list("I'm\nthinking</think>" + TIME), thinking_forced_open=True, tools=TOOLS)
    assert summary(msg) == ("", "I'm\nthinking", [("get_time", {"timezone": "UTC"})])


def _trigger(g, text: str) -> int | None:
    for kind, value in g.triggers:
        m = re.fullmatch(value, text) if kind == "pattern_full" else re.search(value, text)
        if m:
            return m.start(1)
    return None


def test_grammar(grammar_check):
    fmt = GlmFormat()
    bad = call("get_weather", ("location", "Paris"), ("days", "three"))
    for sp in (is_special, lambda t: None):
        g = fmt.grammar(TOOLS, "auto", True, sp)
        grammar_check.check(g)
        for ok in (
            WEATHER,
            TIME,
            call("get_weather", ("days", "2"), ("location", "Nice"), nl=False),
            WEATHER + TIME,
        ):
            assert grammar_check.match(g, ok, sp), ok
        assert not grammar_check.match(g, bad, sp), "bad arguments accepted"
        assert not grammar_check.match(g, call("get_stock", ("symbol", "X")), sp), "unknown tool accepted"
        assert not grammar_check.match(g, call("get_weather", ("place", "X")), sp), "unknown key accepted"
        single = fmt.grammar(TOOLS, "auto", False, sp)
        assert grammar_check.match(single, WEATHER, sp) and not grammar_check.match(
            single, WEATHER + TIME, sp
        )
        named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, sp)
        assert grammar_check.match(named, TIME, sp) and not grammar_check.match(named, WEATHER, sp)
        req = fmt.grammar(TOOLS, "required", True, sp)
        assert req.triggers == () and not grammar_check.match(req, "Hello", sp)
        assert grammar_check.match(req, "<think>hmm</think>\n" + TIME, sp)
        forced = fmt.grammar(TOOLS, "required", True, sp, thinking_forced_open=True)
        assert grammar_check.match(forced, "hmm</think>" + TIME, sp) and not grammar_check.match(
            forced, TIME, sp
        )
    g = fmt.grammar(TOOLS, "auto", True, is_special)
    assert _trigger(g, "Sure. " + WEATHER) == len("Sure. ")
    assert _trigger(g, "<think>maybe <tool_call> no</think>\nOK") is None
    msg = run_pieces(fmt, ["Sure. " + WEATHER], tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"location": "Paris", "days": 3})
    ]
