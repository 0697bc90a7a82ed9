"""Qwen3-Coder (also Qwen 3.5, Nemotron 3 Nano, StepFun 3.5): XML-style calls

```
<tool_call>
<function=get_weather>
<parameter=location>
Paris
</parameter>
</function>
</tool_call>
```

Parameter values are text. As llama.cpp, a value becomes JSON when it parses as JSON, except that a
parameter whose schema says ``string`` stays a string (the request's tools are in ``ChatSyntax.tools``).
One newline after ``<parameter=...>`` and one before ``</parameter>`` are not part of the value.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from .common import (
    NOT_A_CALL,
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
    regex_escape,
    skip_ws,
)
from .reasoning import THINK

_START = regex.compile(r"(?:<tool_call>\s*)?<function=")
_HEAD = regex.compile(r"(<tool_call>\s*)?<function=([^>\n]+)>")
_PARAM = regex.compile(r"<parameter=([^>\n]+)>")


def _types(schema: Any) -> set[str]:
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def convert_value(raw: str, schema: Any) -> Any:
    """A parameter's text as a JSON value: kept a string when the schema says string (or the text is
    not JSON), else parsed."""
    if is_string_schema(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class Qwen3CoderParser(StreamParser):
    """Parser of Qwen3-Coder XML calls."""

    call_start = _START

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._schemas = parameter_tables(syntax.tools)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        m = _HEAD.match(buf, partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial:
            return None
        name = m.group(2).strip()
        props = self._schemas.get(name, {})
        args: dict[str, Any] = {}
        i = m.end()
        while True:
            i = skip_ws(buf, i)
            rest = buf[i:]
            if rest.startswith("</function>"):
                i += len("</function>")
                break
            p = _PARAM.match(buf, i, partial=not final)
            if p is None or p.partial:
                if not final and (p is not None or "</function>".startswith(rest)):
                    return None
                return NOT_A_CALL
            end = buf.find("</parameter>", p.end())
            if end < 0:
                return NOT_A_CALL if final else None
            raw = buf[p.end() : end]
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            key = p.group(1).strip()
            args[key] = convert_value(raw, props.get(key))
            i = end + len("</parameter>")
        if m.group(1):
            i = expect_tag(buf, i, "</tool_call>", final)
            if i is None or i < 0:
                return None if i is None else NOT_A_CALL
        return CallParse([ToolCall(name, json.dumps(args, ensure_ascii=False))], i)


class Qwen3CoderFormat(ChatFormat):
    """Templates with ``<tool_call>``, ``<function=`` and ``<parameter=``."""

    name = "qwen3-coder-xml"
    supports_tools = True
    object_arguments = True
    preserved = ("<think>", "</think>", "<tool_call>", "</tool_call>")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.think = THINK if "<think>" in self.source else None

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules: list[str] = []
        alts = []
        for k, f in enumerate(req.functions):
            params = f["parameters"]
            required = set(params.get("required") or ())
            parts = []
            for j, (key, schema) in enumerate(parameter_schemas(params)):
                value = f"f{k}_v{j}"
                if is_string_schema(schema):
                    rules.append(rf"{value}[lazy]: /(?s:.*){regex_escape('</parameter>')}/")
                    body = value
                else:
                    rules.append(f"{value}: {json_rule(schema)}")
                    body = f'"\\n" {value} "\\n</parameter>"'
                item = f'{lark_str(f"<parameter={key}>")} {body} "\\n"'
                parts.append(item if key in required else f"({item})?")
            head = lark_str(f"<function={f['name']}>\n")
            rules.append(f'f{k}: {head} {" ".join(parts)} "</function>"')
            alts.append(f"f{k}")
        rules.insert(
            0, f'call: {req.lit("<tool_call>")} "\\n" ({" | ".join(alts)}) "\\n" {req.lit("</tool_call>")}'
        )
        prefix, extra = reasoning_prefix(req, self.think)
        rules.insert(0, f"start: {prefix} {req.calls('call')}")
        rules.extend(extra)
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, "<tool_call>"), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return Qwen3CoderParser(syntax)
