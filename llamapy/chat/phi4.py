"""Phi-4-mini: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>``.

Phi-4-mini's template takes the tool list as a JSON string in the system message's ``tools`` field
(``<|system|>...<|tool|>[...]<|/tool|><|end|>``) and does not render tool calls, so
``prepare_messages`` puts the tools there and writes earlier calls into the assistant content.
"""

from __future__ import annotations

import json

from .common import ChatFormat, functions_of, plain_calls
from .reasoning import THINK
from .syntax import SyntaxFormat, end_tag, json_calls, lit, seq, tool_syntax, ws

OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"
DEFAULT_SYSTEM = "You are a helpful assistant with some tools."


# a JSON array (or one object) between the two tags
SYNTAX = tool_syntax(
    seq(
        lit(OPEN, True), ws(), json_calls(array=True, comma=False, keys=("arguments",)), end_tag(CLOSE, True)
    ),
    repeat=False,
)


class Phi4Format(SyntaxFormat, ChatFormat):
    """Templates that read tools from the system message (``<|tool|>...<|/tool|>``)."""

    name = "phi-4-mini"
    tool = SYNTAX
    think = THINK
    preserved = (OPEN, CLOSE, "<|tool|>", "<|/tool|>")

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                calls = plain_calls(m.pop("tool_calls"))
                text = OPEN + json.dumps(calls, ensure_ascii=False) + CLOSE
                m["content"] = (m.get("content") or "") + text
            out.append(m)
        funcs = functions_of(tools)
        if funcs:
            listing = json.dumps(
                [{k: f[k] for k in ("name", "description", "parameters") if k in f} for f in funcs],
                ensure_ascii=False,
            )
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "tools": listing}
            else:
                out.insert(0, {"role": "system", "content": DEFAULT_SYSTEM, "tools": listing})
        return out

    def grammar_think(self) -> None:  # (no reasoning in its grammars)
        return None
