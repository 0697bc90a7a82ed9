"""MiniCPM 5: XML calls ``<function name="..."><param name="...">value</param></function>``

```
<function name="get_weather"><param name="location">Paris</param><param name="days">3</param></function>
```

A value may be wrapped in ``<![CDATA[...]]>`` (the model does so for text with ``<``, ``&`` or newlines).
As llama.cpp, a value becomes JSON when it parses as JSON, except that a parameter whose schema says
``string`` stays a string. Reasoning: ``<think>``.
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
    call_trigger,
    lark_str,
    parameter_tables,
    reasoning_prefix,
    regex_escape,
    skip_ws,
    tagged_call_rules,
)
from .qwen3_coder import convert_value
from .reasoning import THINK

_START = regex.compile(r'<function name="')
_FUNCTION = regex.compile(r'<function name="([^"]+)">')
_PARAM = regex.compile(r'<param name="([^"]+)">')
CDATA, CDATA_END, PARAM_END, FUNCTION_END = "<![CDATA[", "]]>", "</param>", "</function>"


class MiniCpm5Parser(StreamParser):
    """Parser of MiniCPM 5 calls."""

    call_start = _START

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._schemas = parameter_tables(syntax.tools)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        m = _FUNCTION.match(buf, partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial:
            return None
        props = self._schemas.get(m.group(1), {})
        args: dict[str, Any] = {}
        i = m.end()
        while True:
            j = skip_ws(buf, i)
            if buf.startswith(FUNCTION_END, j):
                return CallParse(
                    [ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))], j + len(FUNCTION_END)
                )
            if final and j == len(buf):  # the end tag cut off by the stop
                return CallParse([ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))], j)
            p = _PARAM.match(buf, j, partial=not final)
            if p is None or p.partial:
                if not final and (p is not None or FUNCTION_END.startswith(buf[j:])):
                    return None
                return NOT_A_CALL
            v = p.end()
            if buf.startswith(CDATA, v):
                e = buf.find(CDATA_END, v)
                if e < 0:
                    return NOT_A_CALL if final else None
                raw, after = buf[v + len(CDATA) : e], e + len(CDATA_END)
                if not buf.startswith(PARAM_END, after):
                    if not final and PARAM_END.startswith(buf[after:]):
                        return None
                    return NOT_A_CALL
                e = after
            else:
                if not final and CDATA.startswith(buf[v:]) and len(buf) - v < len(CDATA):
                    return None
                e = buf.find(PARAM_END, v)
                if e < 0:
                    return NOT_A_CALL if final else None
                raw = buf[v:e]
            key = p.group(1)
            args[key] = convert_value(raw, props.get(key))
            i = e + len(PARAM_END)


class MiniCpm5Format(ChatFormat):
    """Templates with ``Tool usage guidelines:``, ``<function name="`` and ``<param name="``."""

    name = "minicpm5"
    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>")

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules = [
            f'str_value: ({lark_str(CDATA)} cdata_body "{PARAM_END}") | plain_body',
            rf"cdata_body[lazy]: /(?s:.*){regex_escape(CDATA_END)}/",
            rf"plain_body[lazy]: /(?s:.*){regex_escape(PARAM_END)}/",
        ]
        call = tagged_call_rules(
            req,
            rules,
            lambda name: (f'<function name="{name}">', FUNCTION_END),
            lambda key: (f'<param name="{key}">', PARAM_END),
            "str_value",
        )
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [f"start: {prefix} {req.calls(call)}", *rules, *extra]
        triggers: tuple[tuple[str, str], ...] = ()
        if not req.required:
            triggers = (call_trigger(regex.escape('<function name="'), self.think, req.thinking_forced_open),)
        return ToolGrammar(assemble(rules), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return MiniCpm5Parser(syntax)
