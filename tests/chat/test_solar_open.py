"""Solar Open: detection and the prompt on the real template, parsing (reasoning message, content wrapper,
calls with their ids) in any split, the grammar and its lazy trigger."""

from __future__ import annotations

import re

import pytest

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.solar_open import SolarOpenFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

END, NEXT = "<|end|>", "<|end|><|begin|>assistant"


def call(name: str, args: str, cid: str = "a1b2c3d4e5") -> str:
    return f"<|tool_call:begin|>{cid}<|tool_call:name|>{name}<|tool_call:args|>{args}<|tool_call:end|>"


def calls(*cs: str) -> str:
    return "<|tool_calls|>" + "".join(cs) + "<|calls|>"


WEATHER = call("get_weather", '{"location": "Paris", "days": 3}')
TIME = call("get_time", '{"timezone": "UTC"}', "zz9zz9zz9z")


def _source() -> str:
    return shared_path("templates", "upstage-Solar-Open-100B.jinja").read_text()


def test_detect_and_prompt():
    src = _source()
    fmt = detect_format(src)
    assert fmt.name == "solar-open" and detect_format(src, tools_requested=False).name == "solar-open"
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert '<|tool_call:name|>get_weather<|tool_call:args|>{"location": "Paris"}<|tool_call:end|>' in out
    assert out.endswith("<|begin|>assistant") and not fmt.thinking_forced_open(out)


CASES = [
    (f"<|content|>It is sunny.{END}", ("It is sunny.", None, [])),
    (f"<|think|>hm{NEXT}<|content|>It is sunny.{END}", ("It is sunny.", "hm", [])),
    (f"<|think|>hm{NEXT}{calls(WEATHER)}", ("", "hm", [("get_weather", {"location": "Paris", "days": 3})])),
    (calls(WEATHER, TIME), ("", None, [("get_weather", {"location": "Paris", "days": 3}),
                                       ("get_time", {"timezone": "UTC"})])),
    (f"<|content|>Checking.{NEXT}{calls(TIME)}", ("Checking.", None, [("get_time", {"timezone": "UTC"})])),
    ("<|think|>still thinking", ("", "still thinking", [])),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = SolarOpenFormat(_source())
    for pieces in ([text], list(text), [text[:20], text[20:]]):
        msg = run_pieces(fmt, pieces, tools=TOOLS)
        assert summary(msg) == expected, pieces


def test_call_ids_and_no_tools():
    fmt = SolarOpenFormat(_source())
    msg = run_pieces(fmt, [calls(WEATHER, TIME)], tools=TOOLS)
    assert [c.id for c in msg.tool_calls] == ["a1b2c3d4e5", "zz9zz9zz9z"]
    msg = run_pieces(fmt, list(f"<|think|>hm{NEXT}<|content|>Hi{END}"), parse_tool_calls=False)
    assert summary(msg) == ("Hi", "hm", [])


def test_stream_never_leaks_markers():
    fmt = SolarOpenFormat(_source())
    parser = fmt.parser(ChatSyntax(fmt.name, tools=TOOLS))
    text = f"<|think|>a{NEXT}<|content|>b{NEXT}{calls(WEATHER)}"
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()[0]
    assert "".join(d.content for d in deltas) == "b"
    assert not any("<|" in d.content or "<|" in d.reasoning_content for d in deltas)


@pytest.mark.parametrize("specials", ["tokens", "text"])
def test_grammar(grammar_check, specials):
    fmt = SolarOpenFormat(_source())
    none = is_special if specials == "tokens" else lambda t: None
    g = fmt.grammar(TOOLS, "auto", True, none)
    grammar_check.check(g)
    for ok in (calls(WEATHER), calls(WEATHER, TIME), calls(TIME)):
        assert grammar_check.match(g, ok, none), ok
    assert not grammar_check.match(g, calls(call("get_weather", '{"location": "P", "days": "x"}')), none)
    assert not grammar_check.match(g, calls(call("get_stock", '{"symbol": "X"}')), none)
    assert not grammar_check.match(g, calls(call("get_time", '{"timezone": "UTC"}', "BAD")), none)
    single = fmt.grammar(TOOLS, "auto", False, none)
    assert not grammar_check.match(single, calls(WEATHER, TIME), none)
    named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, none)
    assert grammar_check.match(named, calls(TIME), none)
    assert not grammar_check.match(named, calls(WEATHER), none)
    req = fmt.grammar(TOOLS, "required", True, none)
    assert req.triggers == () and not grammar_check.match(req, "<|content|>Hello", none)
    assert grammar_check.match(req, f"<|think|>hm{NEXT}{calls(TIME)}", none)
    kind, value = g.triggers[0]
    text = f"<|think|>x{NEXT}<|content|>Sure.{NEXT}{calls(TIME)}"
    m = re.fullmatch(value, text) if kind == "pattern_full" else re.search(value, text)
    assert m is not None and m.start(1) == text.index("<|tool_calls|>")
