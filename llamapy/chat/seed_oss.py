"""ByteDance Seed-OSS: Qwen3-Coder-style XML calls in ``<seed:tool_call>``, reasoning in ``<seed:think>``

```
<seed:think>The user wants the weather.</seed:think>
<seed:tool_call>
<function=get_weather>
<parameter=location>Paris</parameter>
</function>
</seed:tool_call>
```

Parameter values are text (no newline around them, unlike Qwen3-Coder); as llama.cpp, a value becomes
JSON when it parses as JSON, except that a parameter whose schema says ``string`` stays a string.
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
    parameter_tables,
    reasoning_prefix,
    skip_ws,
    tagged_call_rules,
)
from .qwen3_coder import convert_value
from .reasoning import ThinkTags

SEED_THINK = ThinkTags("<seed:think>", "</seed:think>")
BLOCK, BLOCK_END = "<seed:tool_call>", "</seed:tool_call>"
_BLOCK = regex.compile(regex.escape(BLOCK))
_FUNCTION = regex.compile(r"<function=([^>\n]+)>")
_PARAM = regex.compile(r"<parameter=([^>\n]+)>")


class SeedOssParser(StreamParser):
    """Parser of Seed-OSS output."""

    think = SEED_THINK
    call_start = _BLOCK

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._schemas = parameter_tables(syntax.tools)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        j = skip_ws(buf, len(BLOCK))
        m = _FUNCTION.match(buf, j, partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial:
            return None
        name = m.group(1).strip()
        props = self._schemas.get(name, {})
        args: dict[str, Any] = {}
        i = m.end()
        while True:
            j = skip_ws(buf, i)
            if buf.startswith("</function>", j):
                i = j + len("</function>")
                break
            p = _PARAM.match(buf, j, partial=not final)
            if p is None or p.partial:
                if not final and (p is not None or "</function>".startswith(buf[j:])):
                    return None
                return NOT_A_CALL
            e = buf.find("</parameter>", p.end())
            if e < 0:
                return NOT_A_CALL if final else None
            key = p.group(1).strip()
            args[key] = convert_value(buf[p.end() : e], props.get(key))
            i = e + len("</parameter>")
        end = expect_tag(buf, i, BLOCK_END, final)
        if end is None or end < 0:
            return None if end is None else NOT_A_CALL
        return CallParse([ToolCall(name, json.dumps(args, ensure_ascii=False))], end)


class SeedOssFormat(ChatFormat):
    """Templates with ``<seed:tool_call>``."""

    name = "seed-oss"
    supports_tools = True
    think = SEED_THINK
    object_arguments = True
    preserved = (SEED_THINK.start, SEED_THINK.end, BLOCK, BLOCK_END)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        str_value, rules = req.until("str_value", "</parameter>")
        funcs = tagged_call_rules(
            req,
            rules,
            lambda name: (f"<function={name}>", "</function>"),
            lambda key: (f"<parameter={key}>", "</parameter>"),
            str_value,
        )
        call = f"{req.lit(BLOCK)} {WS} {funcs} {WS} {req.lit(BLOCK_END)}"
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [f"start: {prefix} {req.calls('call')}", f"call: {call}", *rules, *extra]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, BLOCK), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return SeedOssParser(syntax)
