"""Cohere Command A-style MoE (Cohere2MoE): Command R7B's calls and reasoning, the answer in
``<|START_TEXT|>...<|END_TEXT|>`` (the tags are dropped)

```
<|START_THINKING|>Let me look.<|END_THINKING|><|START_ACTION|>[
    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Paris"}}
]<|END_ACTION|>
```

The template writes the history's call ids (or fresh numbers), so the grammar takes any string id; the
parser gives the calls fresh unique ids.
"""

from __future__ import annotations

import regex

from .command_r7b import END_ACTION, START_ACTION, CommandR7BParser
from .common import (
    WS,
    CallParse,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    ToolGrammar,
    assemble,
    call_triggers,
    json_rule,
    one_of,
    reasoning_prefix,
)
from .reasoning import COMMAND_R7B_THINK

START_TEXT, END_TEXT = "<|START_TEXT|>", "<|END_TEXT|>"


class Cohere2MoeParser(CommandR7BParser):
    """Parser of Cohere2MoE output."""

    call_start = regex.compile(r"<\|START_ACTION\|>|<\|START_TEXT\|>|<\|END_TEXT\|>")

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        for tag in (START_TEXT, END_TEXT):
            if buf.startswith(tag):
                return CallParse([], len(tag))
        return super().parse_call(buf, final)


class Cohere2MoeFormat(ChatFormat):
    """Templates with ``<|START_TEXT|>`` and ``<|START_ACTION|>``."""

    name = "cohere2moe"
    supports_tools = True
    think = COMMAND_R7B_THINK
    object_arguments = True
    preserved = (
        START_ACTION,
        END_ACTION,
        START_TEXT,
        END_TEXT,
        COMMAND_R7B_THINK.start,
        COMMAND_R7B_THINK.end,
    )

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        item = one_of(
            [
                {
                    "type": "object",
                    "properties": {
                        "tool_call_id": {"type": "string"},
                        "tool_name": {"const": f["name"]},
                        "parameters": f["parameters"],
                    },
                    "required": ["tool_call_id", "tool_name", "parameters"],
                }
                for f in req.functions
            ]
        )
        schema: dict = {"type": "array", "items": item, "minItems": 1}
        if not req.parallel:
            schema["maxItems"] = 1
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} {req.lit(START_ACTION)} {WS} calls {WS} {req.lit(END_ACTION)}",
            f"calls: {json_rule(schema)}",
            *extra,
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, START_ACTION), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return Cohere2MoeParser(syntax)
