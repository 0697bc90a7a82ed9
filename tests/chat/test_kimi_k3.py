"""Kimi K3: detection and the prompt on the real template (arguments as objects, one tag per key),
parsing in any split (as llama.cpp's kimi-k3 parser gives it), the grammar and its lazy trigger."""

from __future__ import annotations

import re

import pytest

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.kimi_k3 import KimiK3Format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

O, CL, S, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
THINK_END, RESP, RESP_END = f"{CL}think{S}", f"{O}response{S}", f"{CL}response{S}"
MSG_END = f"{CL}message{S}"


def arg(key: str, value: str, kind: str = "string") -> str:
    return f'{O}argument key="{key}" type="{kind}"{S}{value}{CL}argument{S}'


def call(name: str, *args: str, n: int = 1) -> str:
    return f'{O}call tool="{name}" index="{n}"{S}' + "".join(args) + f"{CL}call{S}"


def tools(*calls: str) -> str:
    return f"{O}tools{S}" + "".join(calls) + f"{CL}tools{S}"


WEATHER = call("get_weather", arg("location", "Paris"), arg("days", "3", "number"))
TIME = call("get_time", arg("timezone", "UTC"), n=2)


def _source() -> str:
    return shared_path("templates", "Kimi-K3.jinja").read_text()


def test_detect_and_prompt():
    src = _source()
    fmt = detect_format(src)
    assert fmt.name == "kimi-k3" and detect_format(src, tools_requested=False).name == "kimi-k3"
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert call("get_weather", arg("location", "Paris")) in out  # arguments as an object
    assert out.endswith(f'{O}message role="assistant"{S}{O}think{S}')
    assert fmt.thinking_forced_open(out)


CASES = [
    # (output after the generation prompt's open think section, (content, reasoning, calls))
    (f"hmm{THINK_END}{RESP}It is sunny.{RESP_END}{MSG_END}{EOM}", ("It is sunny.", "hmm", [])),
    (f"{THINK_END}{RESP}{RESP_END}{tools(WEATHER)}{MSG_END}",
     ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    (f"x{THINK_END}{RESP}Checking.{RESP_END}{tools(WEATHER, TIME)}{MSG_END}{EOM}",
     ("Checking.", "x", [("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])),
    (f"x{THINK_END}{RESP}{RESP_END}{tools(call('f'))}", ("", "x", [("f", {})])),
    (f"x{THINK_END}{RESP}{RESP_END}{tools(WEATHER)[:-len(CL + 'tools' + S)]}",  # cut off
     ("", "x", [("get_weather", {"location": "Paris", "days": 3})])),
    ("still thinking <|close|>thi", ("", "still thinking <|close|>thi", [])),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = KimiK3Format(_source())
    for pieces in ([text], list(text), [text[:25], text[25:]]):
        msg = run_pieces(fmt, pieces, thinking_forced_open=True, tools=TOOLS)
        assert summary(msg) == expected, pieces


def test_parse_thinking_off_and_no_tools():
    fmt = KimiK3Format(_source())
    text = f"Hello{RESP_END}{MSG_END}{EOM}"
    assert summary(run_pieces(fmt, list(text))) == ("Hello", None, [])
    text = f"{RESP}Hi{RESP_END}{tools(TIME)}"
    msg = run_pieces(fmt, [text], parse_tool_calls=False)
    assert msg.content == f"Hi{O}tools{S}" + TIME + f"{CL}tools{S}" and not msg.tool_calls


def test_stream_never_leaks_markers():
    fmt = KimiK3Format(_source())
    parser = fmt.parser(ChatSyntax(fmt.name, thinking_forced_open=True, tools=TOOLS))
    text = f"a{THINK_END}{RESP}b{RESP_END}{tools(WEATHER)}{MSG_END}{EOM}"
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()[0]
    assert "".join(d.content for d in deltas) == "b"
    assert not any("<|" in d.content or "<|" in d.reasoning_content for d in deltas)


@pytest.mark.parametrize("specials", ["tokens", "text"])
def test_grammar(grammar_check, specials):
    fmt = KimiK3Format(_source())
    none = is_special if specials == "tokens" else lambda t: None
    g = fmt.grammar(TOOLS, "auto", True, none)
    grammar_check.check(g)
    for ok in (tools(WEATHER), tools(WEATHER, TIME), tools(TIME)):
        assert grammar_check.match(g, ok, none), ok
    assert not grammar_check.match(g, tools(call("get_weather", arg("days", "three", "number"))), none)
    assert not grammar_check.match(g, tools(call("get_stock", arg("symbol", "X"))), none)
    single = fmt.grammar(TOOLS, "auto", False, none)
    assert not grammar_check.match(single, tools(WEATHER, TIME), none)
    named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, none)
    assert grammar_check.match(named, tools(TIME), none)
    assert not grammar_check.match(named, tools(WEATHER), none)
    req = fmt.grammar(TOOLS, "required", True, none)
    assert req.triggers == () and not grammar_check.match(req, "Hello", none)
    assert grammar_check.match(req, f"{O}think{S}hm{THINK_END}{RESP}Sure.{RESP_END}" + tools(TIME), none)
    forced = fmt.grammar(TOOLS, "required", True, none, thinking_forced_open=True)
    assert grammar_check.match(forced, f"hm{THINK_END}" + tools(TIME), none)
    assert not grammar_check.match(forced, tools(TIME), none)
    kind, value = g.triggers[0]
    text = f"x{THINK_END}{RESP}Sure.{RESP_END}" + tools(TIME)
    m = re.fullmatch(value, text) if kind == "pattern_full" else re.search(value, text)
    assert m is not None and m.start(1 if m.groups() else 0) == text.index(f"{O}tools{S}")
