"""Kimi K2 (Instruct and Thinking): calls in a section of special tokens, the id naming the function

```
<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"location": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
```

The call id is ``functions.NAME:N`` (N counts the calls of the conversation), kept as the call's id as
llama.cpp does. The section tags are optional around calls (the model sometimes drops them); reasoning
(Kimi K2 Thinking) is a ``<think>`` block.
"""

from __future__ import annotations

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
    ToolCall,
    ToolGrammar,
    assemble,
    call_trigger,
    dump_arguments,
    json_rule,
    lark_str,
    read_json,
    reasoning_prefix,
    skip_ws,
)
from .reasoning import THINK

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_START = regex.compile(r"<\|tool_calls_section_begin\|>|<\|tool_calls_section_end\|>|<\|tool_call_begin\|>")
_HEAD = regex.compile(
    r"<\|tool_call_begin\|>\s*((?:functions\.)?([^\s:<]+)(?::[0-9]+)?)\s*<\|tool_call_argument_begin\|>"
)


class KimiK2Parser(StreamParser):
    """Parser of Kimi K2 output."""

    call_start = _START

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        if not buf.startswith(CALL):  # a section tag: dropped, with the whitespace after it
            end = len(SECTION) if buf.startswith(SECTION) else len(SECTION_END)
            j = skip_ws(buf, end)
            if j == len(buf) and not final:
                return None
            return CallParse([], j)
        m = _HEAD.match(buf, partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial:
            return None
        got = read_json(buf, m.end(), self.json_cache)
        if got is PARTIAL:
            return NOT_A_CALL if final else None
        if got is None or not isinstance(got[0], dict):  # type: ignore[index]
            return NOT_A_CALL
        value, i = got  # type: ignore[misc]
        j = skip_ws(buf, i)
        if buf.startswith(CALL_END, j):
            i = j + len(CALL_END)
        elif not final and CALL_END.startswith(buf[j:]):
            return None
        call_id = m.group(1) if m.group(1).startswith("functions.") else ""
        return CallParse([ToolCall(m.group(2), dump_arguments(value), call_id)], i)


class KimiK2Format(ChatFormat):
    """Templates with ``<|tool_calls_section_begin|>`` and ``<|tool_call_begin|>``."""

    name = "kimi-k2"
    supports_tools = True
    preserved = ("<think>", "</think>", SECTION, SECTION_END, CALL, ARGS, CALL_END)

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.think = THINK if "<think>" in self.source else None

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        lit = req.lit
        rules, alts = [], []
        for k, f in enumerate(req.functions):
            rules.append(f"f{k}_args: {json_rule(f['parameters'])}")
            alts.append(f"{lark_str('functions.' + f['name'] + ':')} /[0-9]+/ {lit(ARGS)} f{k}_args")
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} ({lit(SECTION)} {WS})? {req.calls('call')} ({WS} {lit(SECTION_END)})?",
            f"call: {lit(CALL)} ({' | '.join(alts)}) {lit(CALL_END)}",
            *rules,
            *extra,
        ]
        triggers: tuple[tuple[str, str], ...] = ()
        if not req.required:
            start = rf"{regex.escape(SECTION)}|{regex.escape(CALL)}"
            triggers = (call_trigger(start, self.think, req.thinking_forced_open),)
        return ToolGrammar(assemble(rules), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return KimiK2Parser(syntax)
