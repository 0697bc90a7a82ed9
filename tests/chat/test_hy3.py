"""Tencent Hy3: detection and the prompt on the real template (arguments as objects, one key/value pair
per argument), parsing in any split (as llama.cpp's autoparser reads it), the grammar and its lazy trigger."""

from __future__ import annotations

import re

import pytest

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.hy3 import Hy3Format, is_hy3, suffix_of
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

X = ":opensource>"
THINK, THINK_END = f"<think{X}", f"</think{X}"
BLOCK, BLOCK_END = f"<tool_calls{X}", f"</tool_calls{X}"
ASSISTANT = "<｜hy_Assistant:opensource｜>"


def arg(key: str, value: str, nl: str = "\n") -> str:
    return f"<arg_key{X}{key}</arg_key{X}{nl}<arg_value{X}{value}</arg_value{X}{nl}"


def call(name: str, *args: str, nl: str = "\n") -> str:
    return f"<tool_call{X}{name}<tool_sep{X}{nl}" + "".join(args) + f"</tool_call{X}{nl}"


def block(*calls: str, nl: str = "\n") -> str:
    return f"{BLOCK}{nl}" + "".join(calls) + BLOCK_END


WEATHER = call("get_weather", arg("location", "Paris"), arg("days", "3"))
TIME = call("get_time", arg("timezone", "UTC"))
PARIS = ("get_weather", {"location": "Paris", "days": 3})
JSON_TEXT = '{"a": 1}'


def _source() -> str:
    return shared_path("templates", "tencent-Hy3.jinja").read_text()


def test_detect_and_prompt():
    src = _source()
    fmt = detect_format(src)
    assert fmt.name == "hy3" and detect_format(src, tools_requested=False).name == "hy3"
    assert is_hy3(src) and suffix_of(src) == ":opensource"
    # a template written with literal tags (another suffix, or none) is the family's too
    other = "<tool_calls:x><tool_call:x>{{ name }}<tool_sep:x><arg_key:x>k</arg_key:x><arg_value:x>"
    assert detect_format(other).name == "hy3" and suffix_of(other) == ":x"
    assert Hy3Format(other).preserved[2] == "<tool_calls:x>"
    plain = "<tool_calls><tool_call>{{ name }}<tool_sep><arg_key>k</arg_key><arg_value>v</arg_value>"
    assert detect_format(plain).name == "hy3" and Hy3Format(plain).think.end == "</think>"
    tmpl = ChatTemplate(src, "", "")
    out = tmpl.render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert block(call("get_weather", arg("location", "Paris"))) in out  # arguments as an object
    assert out.endswith(f"{ASSISTANT}{THINK}{THINK_END}") and not fmt.thinking_forced_open(out)
    out = tmpl.render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS),
        add_generation_prompt=True,
        tools=TOOLS,
        reasoning_effort="high",
    )
    assert out.endswith(f"{ASSISTANT}{THINK}") and fmt.thinking_forced_open(out)


CASES = [
    # (output after a generation prompt that opened the think block, (content, reasoning, calls))
    (f"hmm{THINK_END}It is sunny.", ("It is sunny.", "hmm", [])),
    (f"hmm{THINK_END}Checking.{block(WEATHER)}", ("Checking.", "hmm", [PARIS])),
    (f"x{THINK_END}{block(WEATHER, TIME)}", ("", "x", [PARIS, ("get_time", {"timezone": "UTC"})])),
    (f"x{THINK_END}{block(call('get_time'))}", ("", "x", [("get_time", {})])),
    # the tags without the template's newlines
    (f"x{THINK_END}{block(call('get_weather', arg('location', 'Paris', ''), arg('days', '3', '')), nl='')}",
     ("", "x", [PARIS])),
    # a string parameter stays text, another is JSON
    (f"x{THINK_END}{block(call('get_weather', arg('location', JSON_TEXT), arg('days', '[1]')))}",
     ("", "x", [("get_weather", {"location": '{"a": 1}', "days": [1]})])),
    (f"x{THINK_END}{block(WEATHER)[: -len(BLOCK_END)]}", ("", "x", [PARIS])),  # cut off
    (f"x{THINK_END}{block(WEATHER)[: -len(BLOCK_END) - len(f'</tool_call{X}') - 1]}", ("", "x", [PARIS])),
    ("still thinking </think:open", ("", "still thinking </think:open", [])),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = Hy3Format(_source())
    for pieces in ([text], list(text), [text[:17], text[17:]]):
        msg = run_pieces(fmt, pieces, thinking_forced_open=True, tools=TOOLS)
        assert summary(msg) == expected, pieces


def test_parse_thinking_closed_and_no_tools():
    fmt = Hy3Format(_source())
    # the default (no_think) prompt closed the think block
    text = f"Sure.{block(TIME)}"
    expected = ("Sure.", None, [("get_time", {"timezone": "UTC"})])
    assert summary(run_pieces(fmt, list(text), tools=TOOLS)) == expected
    msg = run_pieces(fmt, [text], parse_tool_calls=False)
    assert msg.content == text and not msg.tool_calls


def test_stream_never_leaks_markers():
    fmt = Hy3Format(_source())
    parser = fmt.parser(ChatSyntax(fmt.name, thinking_forced_open=True, tools=TOOLS))
    text = f"a{THINK_END}b{block(WEATHER, TIME)}"
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()[0]
    assert "".join(d.content for d in deltas) == "b"
    assert "".join(d.reasoning_content for d in deltas) == "a"
    assert not any("<" in d.content or "<" in d.reasoning_content for d in deltas)
    assert [d.tool_call_name for d in deltas if d.tool_call_name] == ["get_weather", "get_time"]


@pytest.mark.parametrize("specials", ["tokens", "text"])
def test_grammar(grammar_check, specials):
    fmt = Hy3Format(_source())
    none = is_special if specials == "tokens" else lambda t: None
    g = fmt.grammar(TOOLS, "auto", True, none)
    grammar_check.check(g)
    assert g.preserved_tokens == fmt.preserved
    for ok in (block(WEATHER), block(WEATHER, TIME), block(TIME), block(call("get_time"))):
        assert grammar_check.match(g, ok, none), ok
    assert not grammar_check.match(g, block(call("get_weather", arg("days", "three"))), none)
    assert not grammar_check.match(g, block(call("get_stock", arg("symbol", "X"))), none)
    assert not grammar_check.match(g, WEATHER, none)  # the block is written
    single = fmt.grammar(TOOLS, "auto", False, none)
    assert grammar_check.match(single, block(WEATHER), none)
    assert not grammar_check.match(single, block(WEATHER, TIME), none)
    named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, none)
    assert grammar_check.match(named, block(TIME), none)
    assert not grammar_check.match(named, block(WEATHER), none)
    req = fmt.grammar(TOOLS, "required", True, none)
    assert req.triggers == () and not grammar_check.match(req, "Hello", none)
    assert grammar_check.match(req, block(TIME), none)
    assert grammar_check.match(req, f"{THINK}hm{THINK_END}\n" + block(TIME), none)
    forced = fmt.grammar(TOOLS, "required", True, none, thinking_forced_open=True)
    assert grammar_check.match(forced, f"hm{THINK_END}" + block(TIME), none)
    assert not grammar_check.match(forced, block(TIME), none)
    # the lazy grammar starts at <tool_calls:opensource>, not inside the reasoning
    for forced_open, text in (
        (False, f"Sure.{block(TIME)}"),
        (True, f"x {BLOCK}{THINK_END}Sure.{block(TIME)}"),
    ):
        lazy = fmt.grammar(TOOLS, "auto", True, none, thinking_forced_open=forced_open)
        kind, value = lazy.triggers[0]
        m = re.fullmatch(value, text) if kind == "pattern_full" else re.search(value, text)
        assert m is not None and m.start(1 if m.groups() else 0) == text.rindex(BLOCK)
