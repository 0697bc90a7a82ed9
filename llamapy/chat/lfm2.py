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

from .common import (
    WS,
    ChatFormat,
    ToolCall,
    json_rule,
    lark_str,
    parameter_schemas,
    plain_calls,
)
from .reasoning import THINK
from .syntax import FAIL, NEED, Lark, Node, Scan, SyntaxFormat, lit, seq, tool_syntax

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
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


class PythonCalls(Node):
    """``[f(a=1), g(b="x")]`` up to ``END``: parsed as Python (:func:`parse_python_calls`); the grammar
    writes the list (one call unless parallel calls are allowed), each call's keyword arguments in any
    order, JSON of the parameter's schema."""

    def parse(self, s: Scan, i: int) -> int | None:
        end = s.buf.find(END, i)
        if end < 0 and not s.final:
            return NEED
        calls = parse_python_calls(s.buf[i : end if end >= 0 else len(s.buf)])
        if calls is None:
            return FAIL
        s.calls.extend(calls)
        return end + len(END) if end >= 0 else len(s.buf)

    def lark(self, g: Lark) -> str:
        alts = []
        for k, f in enumerate(g.req.functions):
            kvs = [
                f"{lark_str(key + '=')} {g.rule(f'f{k}_v{j}', json_rule(schema))}"
                for j, (key, schema) in enumerate(parameter_schemas(f["parameters"]))
            ]
            kv = g.rule(f"f{k}_kv", " | ".join(f"({x})" for x in kvs)) if kvs else ""
            args = f'({kv} ("," {WS} {kv})*)?' if kv else ""
            alts.append(g.rule(f"f{k}", f'{lark_str(f["name"] + "(")} {args} ")"'))
        call = f"({' | '.join(alts)})"
        calls = f'{call} ("," {WS} {call})*' if g.req.parallel else call
        return f'"[" {calls} "]" {g.req.lit(END)}'

    def start(self) -> tuple[str, bool]:
        return "", False


SYNTAX = tool_syntax(seq(lit(START, True), PythonCalls()), repeat=False)


class Lfm2Format(SyntaxFormat, ChatFormat):
    """Templates with ``<|tool_list_start|>`` (LFM2) or ``List of tools: [`` (LFM2.5)."""

    name = "lfm2"
    tool = SYNTAX
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
