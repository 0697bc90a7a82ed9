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

from .common import ChatFormat
from .reasoning import THINK
from .syntax import (
    Node,
    SyntaxFormat,
    ToolSyntax,
    end_tag,
    function,
    json_args,
    lit,
    pattern,
    repeat,
    seq,
    tool_syntax,
    ws,
)

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
# the opening tag as small models write it
_BEGIN = r"<｜tool▁calls▁begin｜>|<｜tool_calls_begin｜>|<｜tool calls begin｜>|<｜tool\\_calls\\_begin｜>|<｜tool▁calls｜>"
R1_CALL = function(
    f"{CALL_BEGIN}function{SEP}{{name}}\n```json\n",
    json_args(),
    pattern(r"\s*```\s*<｜tool▁call▁end｜>", seq(ws(), lit("```"), lit(CALL_END))),
    pattern=r"\s*(?:<｜tool▁call▁begin｜>)?function<｜tool▁sep｜>([^\n]+)\n```json\n",
)
V31_CALL = function(
    f"{CALL_BEGIN}{{name}}{SEP}",
    json_args(),
    pattern(r"\s*<｜tool▁call▁end｜>", seq(ws(), lit(CALL_END))),
    pattern=r"\s*(?:<｜tool▁call▁begin｜>)?([^\n<]+)<｜tool▁sep｜>",
)


def deepseek_syntax(call: Node) -> ToolSyntax:
    """A block of R1 or V3.1 calls (``call``), whitespace between."""
    block = seq(pattern(_BEGIN, lit(BEGIN)), repeat(call, end_tag(END, sep="")))
    return tool_syntax(block, repeat=False, tokens=(BEGIN, CALL_BEGIN, SEP, CALL_END, END))


R1, V31 = deepseek_syntax(R1_CALL), deepseek_syntax(V31_CALL)


class DeepSeekR1Format(SyntaxFormat, ChatFormat):
    """Templates with ``<｜tool▁calls▁begin｜>``; V3.1 recognised by its ``prefix``/``thinking`` logic."""

    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", BEGIN, CALL_BEGIN, SEP, CALL_END, END)

    def __init__(self, source: str | None = None, v31: bool = False) -> None:
        super().__init__(source)
        self.v31 = v31
        self.name = "deepseek-v3.1" if v31 else "deepseek-r1"
        self.tool = V31 if v31 else R1
