"""DeepSeek V3.2 and V4: DSML calls (``｜DSML｜`` is one token of the vocabulary)

```
<｜DSML｜function_calls>
<｜DSML｜invoke name="get_weather">
<｜DSML｜parameter name="location" string="true">Paris</｜DSML｜parameter>
<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
</｜DSML｜invoke>
</｜DSML｜function_calls>
```

V4 names the block ``tool_calls``. ``string="true"`` values are text, the others JSON (kept as text when
they do not parse). Reasoning: ``<think>``; the prompt opens the block when thinking is on, and a call block also ends it. As
llama.cpp's handler, V4's tool results are put in the order of the calls they answer.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from .common import ChatFormat, regex_escape
from .reasoning import THINK, partial_suffix
from .syntax import (
    Lark,
    Node,
    SyntaxFormat,
    SyntaxParser,
    Text,
    ToolSyntax,
    accept,
    end_tag,
    function,
    lit,
    repeat,
    seq,
    tagged_params,
    tool_syntax,
    ws,
)

DSML = "｜DSML｜"
_BLOCK = regex.compile(r"<｜DSML｜(function_calls|tool_calls)>")
_BLOCK_TAGS = (f"<{DSML}function_calls>", f"<{DSML}tool_calls>")
INVOKE_END, PARAM_END = "</｜DSML｜invoke>", "</｜DSML｜parameter>"


def _value(match: Any, raw: str, schema: Any) -> Any:
    """A value typed by its ``string="true|false"`` attribute (true when it is missing)."""
    if match.group(2) != "false":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class DsmlText(Text):
    """A string value ends at ``</｜DSML｜parameter>``, the DSML token in it as a token when it is one."""

    def lark_string(self, g: Lark, close: str) -> str:
        ref = g.req.special(DSML)
        if ref is None:
            return g.rule("str_value[lazy]", rf"/(?s:.*){regex_escape(PARAM_END)}/")
        g.rule("str_body[lazy]", r"/(?s:.*)<\//")  # text up to the first "</", then the token
        return g.rule("str_value", f'str_body {ref} "parameter>"')


def _param_open(g: Lark, key: str, is_string: bool) -> str:
    return g.text(f'<{DSML}parameter name="{key}" string="{"true" if is_string else "false"}">')


INVOKE = function(
    f'<{DSML}invoke name="{{name}}">\n',
    tagged_params(
        f'<{DSML}parameter name="{{key}}">',
        PARAM_END,
        lit(INVOKE_END),
        value=DsmlText(),
        pattern=r'<｜DSML｜parameter\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>',
        open_lark=_param_open,
        convert=_value,
    ),
    pattern=r'<｜DSML｜invoke\s+name="([^"]+)"\s*>',
)


def _block(name: str) -> Node:
    return seq(lit(f"<{DSML}{name}>"), ws(), repeat(INVOKE, end_tag(f"</{DSML}{name}>")))


def dsml_syntax(block: str) -> ToolSyntax:
    """Calls in a ``block`` (``function_calls`` or ``tool_calls``) block; the parser takes either."""
    other = "function_calls" if block == "tool_calls" else "tool_calls"
    return tool_syntax(_block(block) | accept(_block(other)), repeat=False, tokens=(DSML,))


class DeepSeekDsmlParser(SyntaxParser):
    """Parser of DSML call blocks."""

    def _step(self, final: bool) -> bool:
        # as llama.cpp, a call block also ends an unclosed reasoning block
        if self._mode == "think" and self.syntax.parse_tool_calls:
            buf = self._buf
            m = _BLOCK.search(buf)
            end = buf.find(THINK.end)
            if m is not None and (end < 0 or m.start() < end):
                self._reasoning(self._strip.push(buf[: m.start()]))
                self._buf, self._mode = buf[m.start() :], "content"
                return True
            if end < 0:
                keep = 0 if final else partial_suffix(buf, THINK.end, *_BLOCK_TAGS)
                self._reasoning(self._strip.push(buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep :]
                return False
        return super()._step(final)


def sort_tool_results(messages: list[dict]) -> list[dict]:
    """llama.cpp's ``deepseek_v4_sort_tool_results``: each run of ``tool`` (and ``user``) messages has
    its tool results reordered by the order of the calls (matched by id) of the assistant message
    before it."""
    out = list(messages)
    order: dict[str, int] = {}
    i = 0
    while i < len(out):
        role = out[i].get("role")
        if role == "assistant" and out[i].get("tool_calls"):
            order = {c.get("id"): k for k, c in enumerate(out[i]["tool_calls"]) if c.get("id")}
            i += 1
            continue
        if role not in ("user", "tool"):
            i += 1
            continue
        j = i
        while j < len(out) and out[j].get("role") in ("user", "tool"):
            j += 1
        slots = [k for k in range(i, j) if out[k].get("role") == "tool"]
        if len(slots) > 1 and order:
            results = sorted((out[k] for k in slots), key=lambda m: order.get(m.get("tool_call_id"), 0))
            for k, m in zip(slots, results, strict=True):
                out[k] = m
        i = j
    return out


class DeepSeekDsmlFormat(SyntaxFormat, ChatFormat):
    """Templates with ``dsml_token`` (DeepSeek V3.2: ``function_calls``; V4: ``tool_calls``)."""

    think = THINK
    parser_class = DeepSeekDsmlParser
    object_arguments = True
    preserved = (DSML, "<think>", "</think>")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.v4 = "function_calls" not in self.source
        self.name = "deepseek-v4" if self.v4 else "deepseek-v3.2"
        self.block = "tool_calls" if self.v4 else "function_calls"
        self.tool = dsml_syntax(self.block)

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        return sort_tool_results(out) if self.v4 else out
