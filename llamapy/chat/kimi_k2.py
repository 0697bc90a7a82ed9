"""Kimi K2 (Instruct and Thinking): calls in a section of special tokens, the id naming the function

```
<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"location": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
```

The call id is ``functions.NAME:N`` (N counts the calls of the conversation), kept as the call's id as
llama.cpp does. The section tags are optional around calls (the model sometimes drops them); reasoning
(Kimi K2 Thinking) is a ``<think>`` block.
"""

from __future__ import annotations

from .common import ChatFormat
from .reasoning import THINK
from .syntax import SyntaxFormat, accept, alt, function, json_args, lit, pattern, seq, tool_syntax, ws

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
SYNTAX = tool_syntax(
    function(
        CALL + "{name}",  # written functions.NAME:N, the id
        json_args(),
        alt(seq(ws(""), lit(CALL_END)), accept(pattern(""))),  # (the end tag may be missing)
        pattern=r"<\|tool_call_begin\|>\s*((?:functions\.)?([^\s:<]+)(?::[0-9]+)?)\s*<\|tool_call_argument_begin\|>",
        name_group=2,
        call_id=lambda m: m.group(1) if m.group(1).startswith("functions.") else "",
        head=lambda g, name: f"{g.text(f'{CALL}functions.{name}:')} /[0-9]+/ {g.text(ARGS)}",
    ),
    tokens=(SECTION, SECTION_END, CALL, ARGS, CALL_END),
    section=(SECTION, SECTION_END),
)


class KimiK2Format(SyntaxFormat, ChatFormat):
    """Templates with ``<|tool_calls_section_begin|>`` and ``<|tool_call_begin|>``."""

    name = "kimi-k2"
    tool = SYNTAX
    preserved = ("<think>", "</think>", SECTION, SECTION_END, CALL, ARGS, CALL_END)

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.think = THINK if "<think>" in self.source else None
