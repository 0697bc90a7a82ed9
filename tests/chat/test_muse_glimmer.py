"""Muse Glimmer (ATEM): detection and the prompt on the real template (arguments as objects), parsing of
its messages in any split (as llama.cpp's muse-glimmer parser gives it), the grammar and its lazy trigger."""

from __future__ import annotations

import re

import pytest

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.muse_glimmer import MuseGlimmerFormat
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

ST, MSG, EOM, EOT = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
NEXT = f"{EOM}{ST}assistant"


def param(key: str, value: str) -> str:
    return f'<atem:parameter name="{key}">{value}</atem:parameter>\n'


def call(name: str, *params: str, to: str | None = None) -> str:
    return (
        f' to={to or name}{MSG}<atem:function_calls>\n<atem:invoke name="{name}">\n'
        + "".join(params)
        + "</atem:invoke>\n</atem:function_calls>"
    )


WEATHER = call("get_weather", param("location", "Paris"), param("days", "3"))
TIME = call("get_time", param("timezone", "UTC"))


def _source() -> str:
    return shared_path("templates", "muse-glimmer.jinja").read_text()


def test_detect_and_prompt():
    src = _source()
    fmt = detect_format(src)
    assert fmt.name == "muse-glimmer" and detect_format(src, tools_requested=False).name == "muse-glimmer"
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert f"{ST}assistant" + call("get_weather", param("location", "Paris")) in out  # arguments as an object
    assert out.endswith(f"{ST}assistant") and not fmt.thinking_forced_open(out)


CASES = [
    # (output after the generation prompt <|start|>assistant, (content, reasoning, calls))
    (f" to=user{MSG}It is sunny.{EOT}", ("It is sunny.", None, [])),
    (f"{MSG}It is sunny.", ("It is sunny.", None, [])),
    (f" to=self{MSG}The user asks.{NEXT} to=user{MSG}It is sunny.{EOT}", ("It is sunny.", "The user asks.", [])),
    (f" to=self{MSG}hm{NEXT}{WEATHER}{EOT}", ("", "hm", [("get_weather", {"location": "Paris", "days": 3})])),
    (f" to=self{MSG}x{NEXT}{WEATHER}{NEXT}{TIME}{EOT}",
     ("", "x", [("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])),
    (f" to=user{MSG}Checking.{NEXT}{TIME}", ("Checking.", None, [("get_time", {"timezone": "UTC"})])),
    (f" to=self{MSG}still thinking <|eo", ("", "still thinking <|eo", [])),  # (held until the end)
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = MuseGlimmerFormat(_source())
    for pieces in ([text], list(text), [text[:25], text[25:]]):
        msg = run_pieces(fmt, pieces, tools=TOOLS)
        assert summary(msg) == expected, pieces


def test_parse_reasoning_none_and_no_tools():
    fmt = MuseGlimmerFormat(_source())
    text = f" to=self{MSG}hm{NEXT} to=user{MSG}Hi{EOT}"
    assert summary(run_pieces(fmt, list(text))) == ("Hi", "hm", [])
    # with neither reasoning nor tools the whole output is content; with tools, the bodies are
    assert summary(run_pieces(fmt, [text], reasoning_format="none")) == (text, None, [])
    msg = run_pieces(fmt, list(text), reasoning_format="none", tools=TOOLS)
    assert summary(msg) == ("hmHi", None, [])
    # a call's body that is not a call is content
    assert summary(run_pieces(fmt, [f" to=x{MSG}oops{EOT}"], tools=TOOLS)) == ("oops", None, [])


def test_stream_never_leaks_markers():
    fmt = MuseGlimmerFormat(_source())
    parser = fmt.parser(ChatSyntax(fmt.name, tools=TOOLS))
    text = f" to=self{MSG}a{NEXT} to=user{MSG}b{NEXT}{WEATHER}{EOT}"
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()[0]
    assert "".join(d.content for d in deltas) == "b"
    assert not any("<" in d.content or "<" in d.reasoning_content or "to=" in d.content for d in deltas)


@pytest.mark.parametrize("specials", ["tokens", "text"])
def test_grammar(grammar_check, specials):
    fmt = MuseGlimmerFormat(_source())
    none = is_special if specials == "tokens" else lambda t: None
    g = fmt.grammar(TOOLS, "auto", True, none)
    grammar_check.check(g)
    for ok in (WEATHER, f"{WEATHER}{NEXT}{TIME}", TIME, call("get_time", param("timezone", "a\nb"))):
        assert grammar_check.match(g, ok, none), ok
    assert not grammar_check.match(g, call("get_weather", param("days", "three")), none)
    assert not grammar_check.match(g, call("get_stock", param("symbol", "X")), none)
    single = fmt.grammar(TOOLS, "auto", False, none)
    assert not grammar_check.match(single, f"{WEATHER}{NEXT}{TIME}", none)
    named = fmt.grammar(TOOLS, {"type": "function", "function": {"name": "get_time"}}, True, none)
    assert grammar_check.match(named, TIME, none)
    assert not grammar_check.match(named, WEATHER, none)
    req = fmt.grammar(TOOLS, "required", True, none)
    assert req.triggers == () and not grammar_check.match(req, f" to=user{MSG}Hello", none)
    assert grammar_check.match(req, f" to=self{MSG}hm{NEXT}{TIME}", none)
    kind, value = g.triggers[0]
    assert kind == "pattern"
    for text in (f" to=self{MSG}x{NEXT}{TIME}", f" to=user{MSG}Sure.{NEXT}{TIME}", TIME):
        m = re.search(value, text)
        assert m is not None and m.start(1) == text.rindex(" to=get_time"), text
    assert re.search(value, f" to=user{MSG}Hello") is None and re.search(value, f" to=self{MSG}x") is None
