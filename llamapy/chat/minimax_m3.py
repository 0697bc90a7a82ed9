"""MiniMax M3: XML calls behind the namespace token ``]<]minimax[>[`` (NS), values nested by their schema

```
NS<tool_call>
NS<invoke name="get_weather">NS<location>ParisNS</location>NS<days>3NS</days>NS</invoke>
NS</tool_call>
```

As llama.cpp's ``minimax-m3.cpp``: a value that may be a string is text, an object with properties is
its members as tags, an array is ``NS<item>...NS</item>`` tags, anything else JSON. Reasoning:
``<mm:think>``; a bare ``</mm:think>`` (the template's prefix when there is none) is dropped.
"""

from __future__ import annotations

from typing import Any

import regex

from .common import PARTIAL, WS, ChatFormat, json_rule, read_json, skip_ws
from .reasoning import ThinkTags
from .syntax import (
    FAIL,
    NEED,
    Lark,
    Node,
    Scan,
    SyntaxFormat,
    alt,
    drop,
    end_tag,
    function,
    lit,
    pattern,
    repeat,
    seq,
    tool_syntax,
    ws,
)

NS = "]<]minimax[>["
THINK = ThinkTags("<mm:think>", "</mm:think>")
BLOCK, BLOCK_END, INVOKE_END = f"{NS}<tool_call>", f"{NS}</tool_call>", f"{NS}</invoke>"
_TAG = regex.compile(regex.escape(NS) + r"<([^<>/\s]+)>")


def _kind(schema: Any) -> str:
    """How a value of ``schema`` is written: string, object, array, any (anyOf) or json."""
    if not isinstance(schema, dict):
        return "string"
    if isinstance(schema.get("anyOf") or schema.get("oneOf"), list):
        return "any"
    t = schema.get("type")
    types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
    if not types and isinstance(schema.get("properties"), dict):
        types = {"object"}
    if not types or "string" in types:
        return "string"
    if types == {"object"} and schema.get("properties"):
        return "object"
    if types == {"array"} and isinstance(schema.get("items"), dict):
        return "array"
    return "json"


def _value(s: Scan, i: int, schema: Any, close: str) -> tuple[Any, int] | int | None:
    """The value at ``i`` and the index after ``close``, ``NEED`` or ``FAIL``."""
    buf, kind = s.buf, _kind(schema)
    if kind == "string":
        e = buf.find(close, i)
        if e < 0:
            return FAIL if s.final else NEED
        return buf[i:e], e + len(close)
    if kind == "any":
        need = False
        for option in schema.get("anyOf") or schema.get("oneOf"):
            got = _value(s, i, option, close)
            if isinstance(got, tuple):
                return got
            need = need or got is NEED
        return NEED if need else FAIL
    if kind == "json":
        got = read_json(buf, i, s.json_cache)
        if got is PARTIAL:
            return NEED
        if got is None:
            return FAIL
        value, j = got
        j = skip_ws(buf, j)
        if buf.startswith(close, j):
            return value, j + len(close)
        return NEED if not s.final and close.startswith(buf[j:]) else FAIL
    items = kind == "array"
    props = {} if items else schema["properties"]
    out: Any = [] if items else {}
    while True:
        j = skip_ws(buf, i)
        if buf.startswith(close, j):
            return out, j + len(close)
        m = _TAG.match(buf, j, partial=not s.final)
        if m is None:
            return NEED if not s.final and close.startswith(buf[j:]) else FAIL
        if m.partial:
            return NEED
        key = m.group(1)
        if items and key != "item":
            return FAIL
        got = _value(s, m.end(), schema["items"] if items else props.get(key), f"{NS}</{key}>")
        if not isinstance(got, tuple):
            return got
        if items:
            out.append(got[0])
        else:
            out[key] = got[0]
        i = got[1]


def _value_lark(g: Lark, schema: Any, close: str, name: str) -> str:
    kind = _kind(schema)
    if kind == "string":
        return g.until(f"{name}_text", close)
    if kind == "any":
        options = schema.get("anyOf") or schema.get("oneOf")
        return (
            "("
            + " | ".join(f"({_value_lark(g, o, close, f'{name}_{k}')})" for k, o in enumerate(options))
            + ")"
        )
    if kind == "json":
        return f"{g.rule(name, json_rule(schema))} {g.text(close)}"
    if kind == "array":
        item = g.rule(
            f"{name}_item",
            f"{g.text(NS + '<item>')} {_value_lark(g, schema['items'], NS + '</item>', f'{name}_i')}",
        )
        return f"({WS} {item})* {WS} {g.text(close)}"
    return f"{_members_lark(g, schema, name)} {WS} {g.text(close)}"


def _members_lark(g: Lark, schema: dict, name: str) -> str:
    required = set(schema.get("required") or ())
    need, optional = [], []
    for j, (key, sub) in enumerate((schema.get("properties") or {}).items()):
        elem = f"{g.text(f'{NS}<{key}>')} {_value_lark(g, sub, f'{NS}</{key}>', f'{name}_{j}')}"
        (need if key in required else optional).append(g.rule(f"{name}_{j}m", elem))
    body = f" {WS} ".join(need)
    if optional:
        body += f" ({WS} ({' | '.join(optional)}))*"
    return body.strip() or '""'


class _Args(Node):
    """A call's arguments up to ``NS</invoke>``."""

    def parse(self, s: Scan, i: int) -> int | None:
        params = {"type": "object", "properties": s.tables.get(s.name, {})}
        got = _value(s, i, params, INVOKE_END)
        if not isinstance(got, tuple):
            return got
        s.args = got[0]
        return got[1]

    def lark(self, g: Lark) -> str:
        assert g.function is not None
        params = g.function["parameters"]
        return f"{_members_lark(g, params, f'f{g.k}a')} {WS} {g.text(INVOKE_END)}"

    def start(self) -> tuple[str, bool]:
        return "", False


INVOKE = function(
    f'{NS}<invoke name="{{name}}">', ws(), _Args(), pattern=regex.escape(NS) + r'<invoke\s+name="([^"]+)"\s*>'
)
SYNTAX = tool_syntax(
    alt(
        seq(lit(BLOCK), ws(), repeat(INVOKE, end_tag(BLOCK_END))),
        drop(pattern(regex.escape(THINK.end))),
    ),
    repeat=False,
    tokens=(NS,),
)


class MiniMaxM3Format(SyntaxFormat, ChatFormat):
    """Templates with ``]<]minimax[>[``, ``<tool_call>`` and ``<invoke name=``."""

    name = "minimax-m3"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = (NS, "<tool_call>", "</tool_call>", THINK.start, THINK.end)
