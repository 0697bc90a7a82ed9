"""Cohere Command R7B: reasoning in ``<|START_THINKING|>...<|END_THINKING|>``, calls as
``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>``, the
answer optionally in ``<|START_RESPONSE|>...<|END_RESPONSE|>`` (the tags are dropped).

The model numbers its calls "0", "1"... in every turn; the template maps ids to those numbers itself,
so the parser gives the calls fresh unique ids.
"""

from __future__ import annotations

from typing import Any

import regex

from .common import (
    ChatFormat,
    ToolCall,
    call_from_object,
)
from .reasoning import COMMAND_R7B_THINK
from .syntax import (
    Node,
    SyntaxFormat,
    ToolSyntax,
    alt,
    drop,
    end_tag,
    json_calls,
    lit,
    pattern,
    seq,
    tool_syntax,
    ws,
)

START_ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"


def action(id_schema: dict, keep_ids: bool = False) -> Node:
    """``<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}, ...]<|END_ACTION|>``; the
    grammar's ``tool_call_id`` has ``id_schema``; the parser keeps a string ``tool_call_id`` as the call's
    id (``keep_ids``) or gives the calls fresh ids."""

    def item(f: dict) -> dict:
        return {
            "type": "object",
            "properties": {
                "tool_call_id": id_schema,
                "tool_name": {"const": f["name"]},
                "parameters": f["parameters"],
            },
            "required": ["tool_call_id", "tool_name", "parameters"],
        }

    def read(v: Any) -> ToolCall | None:
        call = call_from_object(v, "tool_name", ("parameters",))
        if call is None:
            return None
        call_id = v.get("tool_call_id") if keep_ids else None
        return ToolCall(call.name, call.arguments, call_id if isinstance(call_id, str) else "")

    calls = json_calls(array=True, only_array=True, comma=False, item=item, read=read)
    return seq(lit(START_ACTION, True), ws(), calls, end_tag(END_ACTION, True))


def command_syntax(
    id_schema: dict, answer: tuple[str, str], keep_ids: bool = False
) -> tuple[ToolSyntax, tuple[str, ...]]:
    """An :func:`action` block (``keep_ids``: see there), the ``answer``'s tags dropped (with or without
    tools); and the preserved tokens."""
    tags = drop(pattern("|".join(regex.escape(t) for t in answer)))
    think = (COMMAND_R7B_THINK.start, COMMAND_R7B_THINK.end)
    return tool_syntax(alt(action(id_schema, keep_ids), tags), repeat=False), (
        START_ACTION,
        END_ACTION,
        *answer,
        *think,
    )


SYNTAX, PRESERVED = command_syntax(
    {"type": "string", "pattern": "^[0-9]{1,10}$"}, ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
)


class CommandR7BFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<|END_THINKING|><|START_ACTION|>``."""

    name = "command-r7b"
    tool = SYNTAX
    think = COMMAND_R7B_THINK
    object_arguments = True
    preserved = PRESERVED

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        for m in out:
            if m.get("tool_calls") and isinstance(m.get("reasoning_content"), str):
                m["tool_plan"] = m["reasoning_content"]
        return out
