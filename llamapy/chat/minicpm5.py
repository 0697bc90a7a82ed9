"""MiniCPM 5: XML calls ``<function name="..."><param name="...">value</param></function>``

```
<function name="get_weather"><param name="location">Paris</param><param name="days">3</param></function>
```

A value may be wrapped in ``<![CDATA[...]]>`` (the model does so for text with ``<``, ``&`` or newlines).
As llama.cpp, a value becomes JSON when it parses as JSON, except that a parameter whose schema says
``string`` stays a string. Reasoning: ``<think>``.
"""

from __future__ import annotations

from .common import ChatFormat
from .reasoning import THINK
from .syntax import Cdata, SyntaxFormat, end_tag, function, tagged_params, tool_syntax, ws

SYNTAX = tool_syntax(
    function(
        '<function name="{name}">',
        ws(),
        tagged_params(
            '<param name="{key}">',
            "</param>",
            end_tag("</function>", sep=""),  # (the stop may cut it off)
            value=Cdata(),
            key_pattern='[^"]+',
        ),
        name_pattern='[^"]+',
    )
)


class MiniCpm5Format(SyntaxFormat, ChatFormat):
    """Templates with ``Tool usage guidelines:``, ``<function name="`` and ``<param name="``."""

    name = "minicpm5"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>")
