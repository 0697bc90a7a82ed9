"""Qwen3-Coder (also Qwen 3.5, Nemotron 3 Nano, StepFun 3.5): XML-style calls

```
<tool_call>
<function=get_weather>
<parameter=location>
Paris
</parameter>
</function>
</tool_call>
```

Parameter values are text. As llama.cpp, a value becomes JSON when it parses as JSON, except that a
parameter whose schema says ``string`` stays a string (the request's tools are in ``ChatSyntax.tools``).
One newline after ``<parameter=...>`` and one before ``</parameter>`` are not part of the value.
"""

from __future__ import annotations

from .common import ChatFormat
from .reasoning import THINK
from .syntax import (
    SyntaxFormat,
    Text,
    accept,
    convert_value,
    end_tag,
    function,
    lit,
    seq,
    tagged_params,
    tool_syntax,
    ws,
)

__all__ = ["Qwen3CoderFormat", "convert_value"]

NL = '"\\n"'  # where the grammar writes one newline (the parser takes any whitespace)
FUNCTION = function(
    "<function={name}>",
    ws(NL),
    tagged_params(
        "<parameter={key}>",
        "</parameter>",
        lit("</function>"),
        value=Text(newlines=True, special=False),
        declared=True,
        sep=NL,
    ),
)
SYNTAX = tool_syntax(
    seq(lit("<tool_call>", True), ws(NL), FUNCTION, end_tag("</tool_call>", True, sep=NL))
    | accept(FUNCTION)  # the model may leave the block out
)


class Qwen3CoderFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<tool_call>``, ``<function=`` and ``<parameter=``."""

    name = "qwen3-coder-xml"
    tool = SYNTAX
    object_arguments = True
    preserved = ("<think>", "</think>", "<tool_call>", "</tool_call>")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.think = THINK if "<think>" in self.source else None
