"""IBM Granite 3.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}]``, reasoning in ``<think>``, the
answer optionally wrapped in ``<response>...</response>`` (the tags are dropped)."""

from __future__ import annotations

import regex

from .common import (
    NOT_A_CALL,
    PARTIAL,
    CallParse,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolGrammar,
    assemble,
    call_from_object,
    call_triggers,
    json_rule,
    read_json,
    reasoning_prefix,
)
from .phi4 import call_array
from .reasoning import THINK

TOOL_CALL = "<|tool_call|>"
_START = regex.compile(r"<\|tool_call\|>|</?response>")


class GraniteParser(StreamParser):
    """Parser of Granite output."""

    call_start = _START

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        if not buf.startswith(TOOL_CALL):
            tag = _START.match(buf)
            return CallParse([], tag.end()) if tag else NOT_A_CALL
        got = read_json(buf, len(TOOL_CALL), self.json_cache)
        if got is PARTIAL:
            return None
        if got is None or not isinstance(got[0], list):
            return NOT_A_CALL
        calls = [call_from_object(v) for v in got[0]]
        if not calls or any(c is None for c in calls):
            return NOT_A_CALL
        return CallParse(calls, got[1])


class GraniteFormat(ChatFormat):
    """Templates with ``elif thinking`` and ``<|tool_call|>`` (Granite 3.2, 3.3)."""

    name = "granite"
    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", "<response>", "</response>", TOOL_CALL)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} call",
            f"call: {req.lit(TOOL_CALL)} {json_rule(call_array(req.functions, req.parallel))}",
            *extra,
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, TOOL_CALL), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return GraniteParser(syntax)
