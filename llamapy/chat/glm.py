"""GLM 4.5 / 4.6 / 4.7 (also Ling 3.0, Spark 2.5, Laguna): XML-style calls with ``<arg_key>`` / ``<arg_value>`` pairs

```
<tool_call>get_weather
<arg_key>location</arg_key>
<arg_value>Paris</arg_value>
<arg_key>days</arg_key>
<arg_value>3</arg_value>
</tool_call>
```

GLM 4.7 writes the same without the newlines; the name follows ``<tool_call>`` directly and, when the
request's tools are known, must be one of them. Values are text; as llama.cpp, a value becomes JSON when
it parses as JSON, except that a parameter whose schema says ``string`` stays a string (the request's
tools are in ``ChatSyntax.tools``). Reasoning: ``<think>``; GLM 4.7's prompt opens the block itself.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from .common import (
    NOT_A_CALL,
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
    call_triggers,
    expect_tag,
    is_string_schema,
    json_rule,
    lark_str,
    parameter_schemas,
    parameter_tables,
    reasoning_prefix,
    skip_ws,
)
from .qwen3_coder import convert_value
from .reasoning import THINK

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_START = regex.compile(r"<tool_call>")
_HEAD = regex.compile(r"<tool_call>([^\s<>]+)")


def _expect(buf: str, i: int, tag: str, final: bool) -> int | None:
    """``tag`` after optional whitespace at ``i``: the index after it; None: need more; -1: not there."""
    j = skip_ws(buf, i)
    if buf.startswith(tag, j):
        return j + len(tag)
    if not final and tag.startswith(buf[j:]):
        return None
    return -1


class GlmParser(StreamParser):
    """Parser of GLM ``<arg_key>`` calls."""

    call_start = _START

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._schemas = parameter_tables(syntax.tools)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        m = _HEAD.match(buf, partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial or (m.end() == len(buf) and not final):
            return None
        name = m.group(1)
        if self._schemas and name not in self._schemas:  # the request's tools are known: not one of them
            return NOT_A_CALL
        props = self._schemas.get(name, {})
        args: dict[str, Any] = {}
        i = m.end()
        while True:
            end = expect_tag(buf, i, TOOL_CALL_END, final)  # at the end of the text it may be missing
            if end is None:
                return None
            if end >= 0:
                return CallParse([ToolCall(name, json.dumps(args, ensure_ascii=False))], end)
            k = _expect(buf, i, KEY, final)
            if k is None or k < 0:
                return None if k is None else NOT_A_CALL
            ke = buf.find(KEY_END, k)
            if ke < 0:
                return NOT_A_CALL if final else None
            key = buf[k:ke].strip()
            v = _expect(buf, ke + len(KEY_END), VALUE, final)
            if v is None or v < 0:
                return None if v is None else NOT_A_CALL
            ve = buf.find(VALUE_END, v)
            if ve < 0:
                return NOT_A_CALL if final else None
            args[key] = convert_value(buf[v:ve], props.get(key))
            i = ve + len(VALUE_END)


class GlmFormat(ChatFormat):
    """Templates with ``<tool_call>`` and ``<arg_key>``."""

    name = "glm-4.5"
    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", TOOL_CALL, TOOL_CALL_END, KEY, KEY_END, VALUE, VALUE_END)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        lit = req.lit
        rules: list[str] = []
        alts = []
        for k, f in enumerate(req.functions):
            kvs = []
            for j, (key, schema) in enumerate(parameter_schemas(f["parameters"])):
                if is_string_schema(schema):
                    body, extra = req.until("str_value", VALUE_END)
                    rules.extend(r for r in extra if r not in rules)
                else:
                    rules.append(f"f{k}_v{j}: {json_rule(schema)}")
                    body = f"f{k}_v{j} {lit(VALUE_END)}"
                kvs.append(f"{lit(KEY)} {lark_str(key)} {lit(KEY_END)} {WS} {lit(VALUE)} {body}")
            if kvs:
                rules.append(f"f{k}_kv: " + " | ".join(f"({x})" for x in kvs))
                rules.append(f"f{k}: {lark_str(f['name'])} ({WS} f{k}_kv)* {WS}")
            else:
                rules.append(f"f{k}: {lark_str(f['name'])} {WS}")
            alts.append(f"f{k}")
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} {req.calls('call')}",
            f"call: {lit(TOOL_CALL)} ({' | '.join(alts)}) {lit(TOOL_CALL_END)}",
            *rules,
            *extra,
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, TOOL_CALL), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return GlmParser(syntax)
