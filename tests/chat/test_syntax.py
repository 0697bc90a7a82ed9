"""The chat syntax combinators (llamapy/chat/syntax.py): each node's parse (index, NEED, FAIL), the call
marker and trigger derived from a syntax, and a small family built from them whose grammar's output its
parser reads back in any split."""

from __future__ import annotations

import json

import pytest

from llamapy.chat.common import ChatSyntax, GrammarRequest, functions_of
from llamapy.chat.reasoning import THINK
from llamapy.chat.syntax import (
    FAIL,
    NEED,
    Cdata,
    Scan,
    Text,
    accept,
    end_tag,
    function,
    json_args,
    json_calls,
    lit,
    pattern,
    repeat,
    seq,
    tagged_params,
    tool_syntax,
    ws,
)
from tests.chat.conftest import TOOLS, is_special, run_pieces, summary


def scan(text: str, final: bool = False) -> Scan:
    return Scan(text, final, {"f": {"s": {"type": "string"}, "n": {"type": "integer"}}})


@pytest.mark.parametrize(
    ("node", "text", "final", "want"),
    [
        (lit("<a>"), "<a>x", False, 3),
        (lit("<a>"), "<a", False, NEED),
        (lit("<a>"), "<a", True, FAIL),
        (lit("<a>"), "<b>", False, FAIL),
        (ws(), " \n\t x", False, 4),
        (end_tag("</a>"), "  </a>", False, 6),
        (end_tag("</a>"), "  </", False, NEED),
        (end_tag("</a>"), "  ", True, 2),  # cut off by the end of generation
        (end_tag("</a>"), " x", True, FAIL),
        (seq(lit("<a>"), ws(), lit("<b>")), "<a> <b>", False, 7),
        (seq(lit("<a>"), ws(), lit("<b>")), "<a> <c>", False, FAIL),
        (lit("<a>") | lit("<b>"), "<b>", False, 3),
        (lit("<ab>") | lit("<b>"), "<a", False, NEED),
    ],
)
def test_nodes(node, text, final, want):
    assert node.parse(scan(text, final), 0) == want


PARAMS = tagged_params("<p={key}>", "</p>", lit("</f>"))


@pytest.mark.parametrize(
    ("text", "final", "want", "args"),
    [
        ("<p=s>1</p> <p=n>2</p></f>", False, 25, {"s": "1", "n": 2}),  # typed by the schema
        ("<p=n>x</p></f>", False, 14, {"n": "x"}),  # not JSON: kept as text
        ("<p=s>1</p> </", False, NEED, {"s": "1"}),
        ("<p=s>1", False, NEED, {}),
        ("<p=s>1", True, FAIL, {}),
        ("<q>", False, FAIL, {}),
    ],
)
def test_tagged_params(text, final, want, args):
    s = scan(text, final)
    s.name = "f"
    assert PARAMS.parse(s, 0) == want
    assert s.args == args


@pytest.mark.parametrize(
    ("value", "text", "final", "want"),
    [
        (Text(), "a\nb</p>", False, ("a\nb", 7)),
        (Text(newlines=True), "\na\n</p>", False, ("a", 7)),
        (Text(), "a", False, NEED),
        (Cdata(), "<![CDATA[<x>]]></p>", False, ("<x>", 19)),
        (Cdata(), "<![CD", False, NEED),
        (Cdata(), "<![CDATA[x]]>y", False, FAIL),
    ],
)
def test_values(value, text, final, want):
    assert value.read(scan(text, final), 0, "</p>") == want


CALL = function("<f={name}>", ws(), PARAMS)
SYNTAX = tool_syntax(seq(lit("<call>", True), ws(), CALL, end_tag("</call>", True)) | accept(CALL))


def test_marker_and_trigger():
    import regex

    start = regex.compile(SYNTAX.call.start()[0])
    assert start.search("x <call>\n<f=").start() == 2 and start.search("x <f=").start() == 2
    assert start.search("<call> {") is None
    assert SYNTAX.call.trigger() == "<call>"


class Toy:  # (not a ChatFormat: test_grammar_whitespace wants every ChatFormat in its table)
    name = "toy"

    def grammar(self, tools, tool_choice, parallel, is_special):
        req = GrammarRequest(functions_of(tools), tool_choice != "auto", parallel, is_special)
        return SYNTAX.grammar(req, THINK, ("<think>", "</think>"))

    def parser(self, syntax: ChatSyntax):
        return SYNTAX.parser(syntax, THINK)


def test_grammar_output_parses(grammar_check):
    fmt = Toy()
    g = fmt.grammar(TOOLS, "required", True, is_special)
    assert 'call: "<call>"' in g.lark  # (accept(CALL) is never generated)
    text = (
        "<think>hm</think>\n<call>\n<f=get_weather>\n<p=location>Paris</p>\n<p=days>3</p>\n</f>\n</call>"
        " <call><f=get_time><p=timezone>UTC</p></f></call>\n"
    )
    assert grammar_check.match(g, text)
    assert not grammar_check.match(g, text.replace("<p=days>3", "<p=days>x"))
    assert not grammar_check.match(g, text + "\n")  # at most one newline after the calls
    want = ("", "hm", [("get_weather", {"location": "Paris", "days": 3}), ("get_time", {"timezone": "UTC"})])
    for n in (1, 2, 7, len(text)):
        pieces = [text[i : i + n] for i in range(0, len(text), n)]
        assert summary(run_pieces(fmt, pieces, tools=TOOLS)) == want
    auto = fmt.grammar(TOOLS, "auto", True, is_special)
    assert auto.triggers and auto.triggers[0][0] == "pattern_full"


def test_parser_lenient_and_content():
    fmt = Toy()
    msg = run_pieces(fmt, ["Hi <f=get_time><p=timezone>UTC</p></f> <fx"], tools=TOOLS)
    assert msg.content == "Hi <fx" and json.loads(msg.tool_calls[0].arguments) == {"timezone": "UTC"}
    msg = run_pieces(fmt, ["<call><f=get_time>oops</call>"], tools=TOOLS)
    assert msg.content == "<call><f=get_time>oops</call>" and not msg.tool_calls


BLOCK = seq(lit("<b>"), ws(), repeat(CALL, end_tag("</b>")))


@pytest.mark.parametrize(
    ("text", "final", "want", "names"),
    [
        ("<b><f=f></f> <f=g></f></b>", False, 26, ["f", "g"]),
        ("<b><f=f></f> </", False, NEED, ["f"]),
        ("<b><f=f></f>", True, 12, ["f"]),  # the block's end cut off by the end of generation
        ("<b></b>", False, FAIL, []),  # at least one call
        ("<b><f=f></f>x", False, FAIL, ["f"]),
    ],
)
def test_repeat(text, final, want, names):
    s = scan(text, final)
    assert BLOCK.parse(s, 0) == want
    assert [c.name for c in s.calls] == names


@pytest.mark.parametrize(
    ("node", "text", "final", "want", "calls"),
    [
        (json_calls(), '[{"name": "f", "arguments": {}}, {"name": "g"}] x', False, 47, ["f", "g"]),
        (json_calls(), '{"name": "f", "arguments": {"a": 1}}, {', False, 37, ["f"]),  # (the comma taken)
        (json_calls(one=True), '{"name": "f", "arguments": {"a": 1}}, {', False, 36, ["f"]),
        (json_calls(one=True), '[{"name": "f"}]', False, FAIL, []),
        (json_calls(), '{"name": "f", "argu', False, NEED, []),
        (json_calls(), '{"name": "f", "argu', True, FAIL, []),
        (json_calls(), '{"nome": "f"}', False, FAIL, []),
        (function("<f={name}>", json_args()), '<f=g>{"a": 1}', False, 13, ["g"]),
        (function("<f={name}>", json_args()), "<f=g>[1]", False, FAIL, []),
        (seq(pattern(r"```(?:json)?\n"), lit("x")), "```json\nx", False, 9, []),
        (seq(pattern(r"```(?:json)?\n"), lit("x")), "``", False, NEED, []),
    ],
)
def test_json_nodes(node, text, final, want, calls):
    s = scan(text, final)
    assert node.parse(s, 0) == want
    assert [c.name for c in s.calls] == calls


def test_tokens_inside_literals():
    """``tool_syntax(tokens=...)``: a special token inside a literal text is written as the token."""
    from llamapy.chat.syntax import Lark

    req = GrammarRequest([], True, False, lambda t: 300 if t == "|T|" else None)
    g = Lark(req, tokens=("|T|",))
    assert g.text("<|T|x>") == '"<" <[300]> "x>"'
    assert g.text("|T|") == "<[300]>" and g.text("ab") == '"ab"'
    assert Lark(GrammarRequest([], True, False, lambda t: None), tokens=("|T|",)).text("<|T|x>") == (
        '"<" "|T|" "x>"'
    )
