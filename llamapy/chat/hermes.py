"""Hermes 2 Pro / Qwen 2.5 / Qwen 3 / QwQ: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

As llama.cpp's Hermes 2 Pro handler, the parser also takes the variants small models write: the JSON
wrapped in ``<function_call>``, ``<tools>``, ``<response>``, ``<json>``... or a code fence, a bare
``{"name": ...}`` object, and ``<function=name>{args}</function>``. Reasoning: ``<think>``.
"""

from __future__ import annotations

from .common import ChatFormat
from .reasoning import THINK, ThinkTags
from .syntax import (
    Node,
    SyntaxFormat,
    accept,
    alt,
    end_tag,
    function,
    json_args,
    json_calls,
    lit,
    pattern,
    seq,
    tool_syntax,
    ws,
)

CALL_JSON = json_calls(one=True, first=r'\{\s*"name"')
WRAPPERS = ("<function_call>", "<tools>", "<tool>", "<response>", "<json>", "<xml>", "<JSON>")


def _wrapped(tag: str, special: bool = False) -> Node:
    return seq(lit(tag, special), ws(), CALL_JSON, end_tag("</" + tag[1:], special))


ARGS = seq(json_args(), end_tag("</function>"))
WRAPPED = alt(
    _wrapped("<tool_call>", True),  # the one the grammar writes
    *(accept(_wrapped(tag)) for tag in WRAPPERS),
    accept(seq(ws(), CALL_JSON)),  # a bare object
)
SYNTAX = tool_syntax(
    alt(
        WRAPPED,
        accept(seq(pattern(r"```(?:xml|json)?\n"), ws(), WRAPPED, end_tag("```"))),
        # <function=name>{args}</function>, <function name="name">{args}</function>
        accept(function("<function={name}>", ARGS, pattern="<function=([^>]+)>")),
        accept(function('<function name="{name}">', ARGS, pattern='<function name="([^"]+)">')),
    )
)


class HermesFormat(SyntaxFormat, ChatFormat):
    """Hermes 2 Pro, Hermes 3, Qwen 2.5, Qwen 3, QwQ (``<tool_call>`` in the template)."""

    name = "hermes-2-pro"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", "<tool_call>", "</tool_call>")

    def grammar_think(self) -> ThinkTags | None:  # reasoning in grammars only where the template has it
        return THINK if "<think>" in self.source else None
