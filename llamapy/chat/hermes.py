"""Hermes 2 Pro / Qwen 2.5 / Qwen 3 / QwQ: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

As llama.cpp's Hermes 2 Pro handler, the parser also takes the variants small models write: the JSON
wrapped in ``<function_call>``, ``<tools>``, ``<response>``, ``<json>``... or a code fence, a bare
``{"name": ...}`` object, and ``<function=name>{args}</function>``. Reasoning: ``<think>``.
"""

from __future__ import annotations

import regex

from .common import (
    NOT_A_CALL,
    PARTIAL,
    WS,
    CallParse,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolCall,
    ToolGrammar,
    assemble,
    call_from_object,
    call_triggers,
    dump_arguments,
    expect_tag,
    json_rule,
    one_of,
    read_json,
    reasoning_prefix,
)
from .reasoning import THINK, ThinkTags

_OPEN = regex.compile(
    r"(?:(```(?:xml|json)?\n\s*)?(<tool_call>|<function_call>|<tools>|<tool>|<response>|<json>|<xml>|<JSON>)?"
    r'(\s*\{\s*"name"))'
    r'|<function=([^>]+)>|<function name="([^"]+)">'
)


class HermesParser(StreamParser):
    """Parser of Hermes-style output."""

    call_start = _OPEN

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        m = _OPEN.match(buf)
        if m is None:
            return NOT_A_CALL
        got = read_json(buf, m.start(3) if m.group(3) is not None else m.end(), self.json_cache)
        if got is PARTIAL:
            return None
        if got is None:
            return NOT_A_CALL
        value, i = got
        if m.group(3) is not None:
            call = call_from_object(value, args_keys=("arguments", "parameters"))
            closers = [f"</{m.group(2)[1:]}" if m.group(2) else "", "```" if m.group(1) else ""]
        elif isinstance(value, dict):
            call = ToolCall((m.group(4) or m.group(5)).strip(), dump_arguments(value))
            closers = ["</function>", "```" if m.group(1) else ""]
        else:
            call = None
        if call is None:
            return NOT_A_CALL
        for tag in closers:
            if tag:
                i = expect_tag(buf, i, tag, final)
                if i is None or i < 0:
                    return None if i is None else NOT_A_CALL
        return CallParse([call], i)


class HermesFormat(ChatFormat):
    """Hermes 2 Pro, Hermes 3, Qwen 2.5, Qwen 3, QwQ (``<tool_call>`` in the template)."""

    name = "hermes-2-pro"
    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", "<tool_call>", "</tool_call>")

    @property
    def _grammar_think(self) -> ThinkTags | None:  # reasoning in grammars only where the template has it
        return THINK if "<think>" in self.source else None

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        schemas = [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in req.functions
        ]
        prefix, extra = reasoning_prefix(req, self._grammar_think)
        rules = [
            f"start: {prefix} {req.calls('call')}",
            f"call: {req.lit('<tool_call>')} {WS} call_json {WS} {req.lit('</tool_call>')}",
            f"call_json: {json_rule(one_of(schemas))}",
            *extra,
        ]
        return ToolGrammar(
            assemble(rules), call_triggers(req, self._grammar_think, "<tool_call>"), self.preserved
        )

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return HermesParser(syntax)
