"""DeepSeek R1 (and its distills) and DeepSeek V3.1: reasoning in ``<think>``, calls in a block

```
<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
```json
{"location": "Paris"}
```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
```

V3.1 writes ``<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"location": "Paris"}<｜tool▁call▁end｜>``.
As llama.cpp, the parser also takes the opening-tag variants the distilled models write.
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
    call_triggers,
    dump_arguments,
    json_rule,
    lark_str,
    read_json,
    reasoning_prefix,
    skip_ws,
)
from .reasoning import THINK

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_BEGIN = regex.compile(
    r"<｜tool▁calls▁begin｜>|<｜tool_calls_begin｜>|<｜tool calls begin｜>|<｜tool\\_calls\\_begin｜>|<｜tool▁calls｜>"
)
_R1_CALL = regex.compile(r"\s*(?:<｜tool▁call▁begin｜>)?function<｜tool▁sep｜>([^\n]+)\n```json\n")
_R1_CLOSE = regex.compile(r"\s*```\s*<｜tool▁call▁end｜>")
_V31_CALL = regex.compile(r"\s*(?:<｜tool▁call▁begin｜>)?([^\n<]+)<｜tool▁sep｜>")
_V31_CLOSE = regex.compile(r"\s*<｜tool▁call▁end｜>")


class DeepSeekParser(StreamParser):
    """Parser of a DeepSeek tool-call block (R1 or V3.1 syntax)."""

    call_start = _BEGIN

    def __init__(self, syntax: ChatSyntax, v31: bool = False) -> None:
        super().__init__(syntax)
        self._call_re, self._close_re = (_V31_CALL, _V31_CLOSE) if v31 else (_R1_CALL, _R1_CLOSE)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        i = _BEGIN.match(buf).end()
        calls: list[ToolCall] = []
        while True:
            j = skip_ws(buf, i)
            if buf.startswith(END, j):
                return CallParse(calls, j + len(END)) if calls else NOT_A_CALL
            m = self._call_re.match(buf, i, partial=not final)
            if m is None or m.partial:
                if final:
                    return CallParse(calls, len(buf)) if calls and j == len(buf) else NOT_A_CALL
                return None if m is not None or END.startswith(buf[j:]) else NOT_A_CALL
            got = read_json(buf, m.end(), self.json_cache)
            if got is PARTIAL:
                return None if not final else NOT_A_CALL
            if got is None or not isinstance(got[0], dict):
                return NOT_A_CALL
            c = self._close_re.match(buf, got[1], partial=not final)
            if c is None:
                return NOT_A_CALL
            if c.partial:
                return None
            calls.append(ToolCall(m.group(1).strip(), dump_arguments(got[0])))
            i = c.end()


class DeepSeekR1Format(ChatFormat):
    """Templates with ``<｜tool▁calls▁begin｜>``; V3.1 recognised by its ``prefix``/``thinking`` logic."""

    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", BEGIN, CALL_BEGIN, SEP, CALL_END, END)

    def __init__(self, source: str | None = None, v31: bool = False) -> None:
        super().__init__(source)
        self.v31 = v31
        self.name = "deepseek-v3.1" if v31 else "deepseek-r1"

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules = []
        alts = []
        for k, f in enumerate(req.functions):
            rules.append(f"f{k}_args: {json_rule(f['parameters'])}")
            name = lark_str(f["name"])
            name_json = lark_str(f["name"] + "\n```json\n")
            if self.v31:
                alts.append(f"{req.lit(CALL_BEGIN)} {name} {req.lit(SEP)} f{k}_args {WS} {req.lit(CALL_END)}")
            else:
                alts.append(
                    f'{req.lit(CALL_BEGIN)} "function" {req.lit(SEP)} {name_json} f{k}_args {WS} '
                    f'"```" {req.lit(CALL_END)}'
                )
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} {req.lit(BEGIN)} {req.calls('call')} {req.lit(END)}",
            f"call: {' | '.join(alts)}",
            *rules,
            *extra,
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, BEGIN), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return DeepSeekParser(syntax, self.v31)
