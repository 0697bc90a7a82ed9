"""Cohere Command R7B: reasoning in ``<|START_THINKING|>...<|END_THINKING|>``, calls as
``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>``, the
answer optionally in ``<|START_RESPONSE|>...<|END_RESPONSE|>`` (the tags are dropped).

The model numbers its calls "0", "1"... in every turn; the template maps ids to those numbers itself,
so the parser gives the calls fresh unique ids.
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
    expect_tag,
    json_rule,
    one_of,
    read_json,
    reasoning_prefix,
)
from .reasoning import COMMAND_R7B_THINK

START_ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"
_START = regex.compile(r"<\|START_ACTION\|>|<\|START_RESPONSE\|>|<\|END_RESPONSE\|>")


class CommandR7BParser(StreamParser):
    """Parser of Command R7B output."""

    think = COMMAND_R7B_THINK
    call_start = _START

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        if not buf.startswith(START_ACTION):
            return CallParse([], _START.match(buf).end())
        got = read_json(buf, len(START_ACTION), self.json_cache)
        if got is PARTIAL:
            return None
        if got is None or not isinstance(got[0], list):
            return NOT_A_CALL
        calls = [call_from_object(v, "tool_name", ("parameters",)) for v in got[0]]
        if not calls or any(c is None for c in calls):
            return NOT_A_CALL
        i = expect_tag(buf, got[1], END_ACTION, final)
        if i is None or i < 0:
            return None if i is None else NOT_A_CALL
        return CallParse([ToolCall(c.name, c.arguments) for c in calls], i)


class CommandR7BFormat(ChatFormat):
    """Templates with ``<|END_THINKING|><|START_ACTION|>``."""

    name = "command-r7b"
    supports_tools = True
    think = COMMAND_R7B_THINK
    object_arguments = True
    preserved = (
        START_ACTION,
        END_ACTION,
        "<|START_RESPONSE|>",
        "<|END_RESPONSE|>",
        "<|START_THINKING|>",
        "<|END_THINKING|>",
    )

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        for m in out:
            if m.get("tool_calls") and isinstance(m.get("reasoning_content"), str):
                m["tool_plan"] = m["reasoning_content"]
        return out

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        schema = {
            "type": "array",
            "items": one_of(
                [
                    {
                        "type": "object",
                        "properties": {
                            "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                            "tool_name": {"const": f["name"]},
                            "parameters": f["parameters"],
                        },
                        "required": ["tool_call_id", "tool_name", "parameters"],
                    }
                    for f in req.functions
                ]
            ),
            "minItems": 1,
        }
        if not req.parallel:
            schema["maxItems"] = 1
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} {req.lit(START_ACTION)} {WS} calls {WS} {req.lit(END_ACTION)}",
            f"calls: {json_rule(schema)}",
            *extra,
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, START_ACTION), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return CommandR7BParser(syntax)
