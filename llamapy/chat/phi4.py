"""Phi-4-mini: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>``.

Phi-4-mini's template takes the tool list as a JSON string in the system message's ``tools`` field
(``<|system|>...<|tool|>[...]<|/tool|><|end|>``) and does not render tool calls, so
``prepare_messages`` puts the tools there and writes earlier calls into the assistant content.
"""

from __future__ import annotations

import json

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
    ToolGrammar,
    assemble,
    call_from_object,
    call_triggers,
    expect_tag,
    functions_of,
    json_rule,
    one_of,
    plain_calls,
    read_json,
)
from .reasoning import THINK

OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"
DEFAULT_SYSTEM = "You are a helpful assistant with some tools."


class Phi4Parser(StreamParser):
    """Parser of Phi-4-mini calls: a JSON array (or one object) between the two tags."""

    call_start = regex.compile(regex.escape(OPEN))

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        got = read_json(buf, len(OPEN), self.json_cache)
        if got is PARTIAL:
            return None
        if got is None:
            return NOT_A_CALL
        value, i = got
        calls = [call_from_object(v) for v in (value if isinstance(value, list) else [value])]
        if not calls or any(c is None for c in calls):
            return NOT_A_CALL
        i = expect_tag(buf, i, CLOSE, final)
        if i is None or i < 0:
            return None if i is None else NOT_A_CALL
        return CallParse(calls, i)


def call_array(functions: list[dict], parallel: bool) -> dict:
    """The JSON schema of an array of ``{"name", "arguments"}`` calls of ``functions``."""
    schema = {
        "type": "array",
        "items": one_of(
            [
                {
                    "type": "object",
                    "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for f in functions
            ]
        ),
        "minItems": 1,
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


class Phi4Format(ChatFormat):
    """Templates that read tools from the system message (``<|tool|>...<|/tool|>``)."""

    name = "phi-4-mini"
    supports_tools = True
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

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules = [
            "start: call",
            f"call: {req.lit(OPEN)} {WS} calls {WS} {req.lit(CLOSE)}",
            f"calls: {json_rule(call_array(req.functions, req.parallel))}",
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, None, OPEN), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return Phi4Parser(syntax)
