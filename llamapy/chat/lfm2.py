"""Liquid LFM2 / LFM2.5: Python-style calls between ``<|tool_call_start|>`` and ``<|tool_call_end|>``

```
<|tool_call_start|>[get_weather(location="Paris", days=3), get_time(timezone="UTC")]<|tool_call_end|>
```

Arguments are keyword arguments whose values are Python literals or JSON (``true``/``false``/``null``
too, as llama.cpp's ``allow_json_literals``). Reasoning: ``<think>`` where the template has it. Templates
that do not render an assistant's calls (LFM2) get them written into the content in this syntax.
"""

from __future__ import annotations

import ast
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
    json_rule,
    lark_str,
    parameter_schemas,
    plain_calls,
    reasoning_prefix,
)
from .reasoning import THINK

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
_START = regex.compile(regex.escape(START))
_JSON_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


class _NotLiteral(Exception):
    pass


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool | type(None)):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _literal(node.operand)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        keys = [_literal(k) for k in node.keys]  # type: ignore[arg-type]
        if all(isinstance(k, str) for k in keys):
            return dict(zip(keys, (_literal(v) for v in node.values), strict=True))
    raise _NotLiteral


def parse_python_calls(text: str) -> list[ToolCall] | None:
    """``[f(a=1), g(b="x")]`` (or one call without the list) as calls; None when it is not that."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func) if isinstance(node.func, ast.Name | ast.Attribute) else None
        if not name or any(k.arg is None for k in node.keywords):
            return None
        try:
            args = {k.arg: _literal(k.value) for k in node.keywords}
        except (_NotLiteral, RecursionError):
            return None
        calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
    return calls or None


def python_call_text(calls: list[dict]) -> str:
    """History calls (``{"name", "arguments"}``) in this syntax, values written as JSON."""
    items = []
    for c in calls:
        args = c["arguments"] if isinstance(c["arguments"], dict) else {}
        kv = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        items.append(f"{c['name']}({kv})")
    return f"{START}[{', '.join(items)}]{END}"


class Lfm2Parser(StreamParser):
    """Parser of LFM2 output."""

    call_start = _START

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        end = buf.find(END, len(START))
        if end < 0 and not final:
            return None
        calls = parse_python_calls(buf[len(START) : end if end >= 0 else len(buf)])
        if calls is None:
            return NOT_A_CALL
        return CallParse(calls, end + len(END) if end >= 0 else len(buf))


class Lfm2Format(ChatFormat):
    """Templates with ``<|tool_list_start|>`` (LFM2) or ``List of tools: [`` (LFM2.5)."""

    name = "lfm2"
    supports_tools = True
    object_arguments = True
    preserved = ("<think>", "</think>", START, END, "<|tool_list_start|>", "<|tool_list_end|>")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.think = THINK if "<think>" in self.source or "</think>" in self.source else None
        self.renders_calls = "tool_calls" in self.source

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        for m in out:
            if m.get("role") == "assistant" and isinstance(m.get("reasoning_content"), str):
                m["thinking"] = m["reasoning_content"]
            if m.get("tool_calls") and not self.renders_calls:
                m["content"] = (m.get("content") or "") + python_call_text(plain_calls(m.pop("tool_calls")))
        return out

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules, alts = [], []
        for k, f in enumerate(req.functions):
            kvs = []
            for j, (key, schema) in enumerate(parameter_schemas(f["parameters"])):
                rules.append(f"f{k}_v{j}: {json_rule(schema)}")
                kvs.append(f"{lark_str(key + '=')} f{k}_v{j}")
            if kvs:
                rules.append(f"f{k}_kv: " + " | ".join(f"({x})" for x in kvs))
                args = f'(f{k}_kv ("," {WS} f{k}_kv)*)?'
            else:
                args = ""
            alts.append(f"f{k}")
            rules.append(f'f{k}: {lark_str(f["name"] + "(")} {args} ")"')
        call = f"({' | '.join(alts)})"
        calls = f'{call} ("," {WS} {call})*' if req.parallel else call
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [f'start: {prefix} {req.lit(START)} "[" {calls} "]" {req.lit(END)}', *rules, *extra]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, START), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return Lfm2Parser(syntax)
