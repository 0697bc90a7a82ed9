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

from .common import ChatFormat
from .reasoning import THINK
from .syntax import SyntaxFormat, end_tag, function, lit, repeat, seq, tagged_params, tool_syntax, ws

BLOCK, BLOCK_END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_END, PARAM_END = "</invoke>", "</parameter>"
INVOKE = function(
    '<invoke name="{name}">',
    ws(),
    tagged_params(
        '<parameter name="{key}">',
        PARAM_END,
        lit(INVOKE_END),
        pattern=r'<parameter\s+name="([^"]+)"\s*>',
    ),
    pattern=r'<invoke\s+name="([^"]+)"\s*>',
)
# one block holding the calls
SYNTAX = tool_syntax(seq(lit(BLOCK, True), ws(), repeat(INVOKE, end_tag(BLOCK_END, True))), repeat=False)


class MiniMaxM2Format(SyntaxFormat, ChatFormat):
    """Templates with ``<minimax:tool_call>``."""

    name = "minimax-m2"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", BLOCK, BLOCK_END)
