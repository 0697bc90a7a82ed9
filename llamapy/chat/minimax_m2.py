"""MiniMax M2: XML-style calls in a ``<minimax:tool_call>`` block

```
<minimax:tool_call>
<invoke name="get_weather">
<parameter name="location">Paris</parameter>
<parameter name="days">3</parameter>
</invoke>
</minimax:tool_call>
```

Parameter values are text; as llama.cpp, a value becomes JSON when it parses as JSON, except that a
parameter whose schema says ``string`` stays a string (the request's tools are in ``ChatSyntax.tools``).
Reasoning: ``<think>``, which the generation prompt opens.
"""

from __future__ import annotations

import json

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
    parameter_tables,
    read_tagged_params,
    reasoning_prefix,
    skip_ws,
    tagged_call_rules,
)
from .qwen3_coder import convert_value
from .reasoning import THINK

BLOCK, BLOCK_END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_END, PARAM_END = "</invoke>", "</parameter>"
_BLOCK = regex.compile(r"<minimax:tool_call>")
_INVOKE = regex.compile(r'<invoke\s+name="([^"]+)"\s*>')
_PARAM = regex.compile(r'<parameter\s+name="([^"]+)"\s*>')


class MiniMaxM2Parser(StreamParser):
    """Parser of ``<minimax:tool_call>`` blocks."""

    call_start = _BLOCK

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._schemas = parameter_tables(syntax.tools)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        calls: list[ToolCall] = []
        i = len(BLOCK)
        while True:
            j = skip_ws(buf, i)
            if buf.startswith(BLOCK_END, j) or (final and j == len(buf) and calls):
                end = expect_tag(buf, j, BLOCK_END, final)
                return CallParse(calls, end) if calls and end is not None and end >= 0 else NOT_A_CALL
            inv = _INVOKE.match(buf, j, partial=not final)
            if inv is None or inv.partial:
                if not final and (inv is not None or BLOCK_END.startswith(buf[j:])):
                    return None
                return NOT_A_CALL
            props = self._schemas.get(inv.group(1), {})
            got = read_tagged_params(
                buf, inv.end(), final, _PARAM, PARAM_END, INVOKE_END,
                lambda p, raw, props=props: convert_value(raw, props.get(p.group(1))),
            )  # fmt: skip
            if got is None or got is NOT_A_CALL:
                return got
            args, i = got
            calls.append(ToolCall(inv.group(1), json.dumps(args, ensure_ascii=False)))


class MiniMaxM2Format(ChatFormat):
    """Templates with ``<minimax:tool_call>``."""

    name = "minimax-m2"
    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", BLOCK, BLOCK_END)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        str_value, rules = req.until("str_value", PARAM_END)
        invoke = tagged_call_rules(
            req,
            rules,
            lambda name: (f'<invoke name="{name}">', INVOKE_END),
            lambda key: (f'<parameter name="{key}">', PARAM_END),
            str_value,
        )
        calls = f"{invoke} ({WS} {invoke})*" if req.parallel else invoke
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [f"start: {prefix} {req.lit(BLOCK)} {WS} {calls} {WS} {req.lit(BLOCK_END)}", *rules, *extra]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, BLOCK), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return MiniMaxM2Parser(syntax)
