"""MiniMax M3: detection and the prompt on the real template, parsing (values nested by their schema, as
llama.cpp's minimax-m3 parser) in any split, the grammar."""

from __future__ import annotations

import pytest
import regex

from llamapy.chat import ChatSyntax, detect_format
from llamapy.chat.minimax_m3 import MiniMaxM3Format
from llamapy.vocab.chat_template import ChatTemplate
from tests.chat.conftest import TOOLS, run_pieces, summary
from tests.chat.test_prepare import CONVERSATION
from tests.util import shared_path

NS = "]<]minimax[>["
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "score": {"type": "number"},
                    },
                },
                "exact": {"type": "boolean"},
            },
            "required": ["query"],
        },
    },
}


def tag(key: str, value: str) -> str:
    return f"{NS}<{key}>{value}{NS}</{key}>"


def invoke(name: str, *args: str) -> str:
    return f'{NS}<invoke name="{name}">' + "".join(args) + f"{NS}</invoke>\n"


def block(*calls: str) -> str:
    return f"{NS}<tool_call>\n" + "".join(calls) + f"{NS}</tool_call>"


def _source() -> str:
    return shared_path("templates", "MiniMax-M3.jinja").read_text()


def test_prompt():
    src = _source()
    fmt = detect_format(src)
    assert isinstance(fmt, MiniMaxM3Format)
    out = ChatTemplate(src, "", "").render(
        fmt.prepare_messages(CONVERSATION, tools=TOOLS), add_generation_prompt=True, tools=TOOLS
    )
    assert invoke("get_weather", tag("location", "Paris")) in out


NESTED = invoke(
    "search",
    tag("query", "a b"),
    tag("filters", tag("tags", tag("item", "x") + tag("item", "y")) + tag("score", "0.5")),
    tag("exact", "false"),
)
CASES = [
    ("</mm:think>It is sunny.", ("It is sunny.", None, [])),
    ("<mm:think>The user asks.</mm:think>It is sunny.", ("It is sunny.", "The user asks.", [])),
    ("</mm:think>" + block(invoke("get_weather", tag("location", "Paris"), tag("days", "3"))),
     ("", None, [("get_weather", {"location": "Paris", "days": 3})])),
    ("<mm:think>hm</mm:think>Sure." + block(NESTED, invoke("get_time", tag("timezone", "UTC"))),
     ("Sure.", "hm", [("search", {"query": "a b", "filters": {"tags": ["x", "y"], "score": 0.5}, "exact": False}),
                      ("get_time", {"timezone": "UTC"})])),
]  # fmt: skip


@pytest.mark.parametrize("k", range(len(CASES)))
def test_parse(k):
    text, expected = CASES[k]
    fmt = MiniMaxM3Format(_source())
    for pieces in ([text], list(text), [text[:30], text[30:]]):
        msg = run_pieces(fmt, pieces, tools=[*TOOLS, SEARCH])
        assert summary(msg) == expected, pieces


def test_stream_never_leaks_markers():
    fmt = MiniMaxM3Format(_source())
    text = CASES[3][0]
    parser = fmt.parser(ChatSyntax(fmt.name, tools=[*TOOLS, SEARCH]))
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()[0]
    assert "".join(d.content for d in deltas) == "Sure."


def test_grammar(grammar_check):
    fmt = MiniMaxM3Format(_source())
    none = lambda t: None  # noqa: E731
    tools = [*TOOLS, SEARCH]
    g = fmt.grammar(tools, "auto", True, none)
    grammar_check.check(g)
    assert grammar_check.match(g, block(NESTED), none)
    assert grammar_check.match(g, block(invoke("get_weather", tag("location", "Paris"))), none)
    assert not grammar_check.match(
        g, block(invoke("get_weather", tag("days", "3"))), none
    )  # location required
    assert not grammar_check.match(
        g, block(invoke("get_weather", tag("location", "P"), tag("days", "x"))), none
    )
    assert g.triggers and regex.search(
        g.triggers[0][1], "Let me look. " + block(invoke("get_time", tag("timezone", "UTC")))
    )
    assert not regex.search(g.triggers[0][1], "Let me look. <tool_call>")
    req = fmt.grammar(tools, "required", True, none)
    assert req.triggers == () and not grammar_check.match(req, "Hello", none)
