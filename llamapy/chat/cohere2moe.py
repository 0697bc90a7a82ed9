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

from .command_r7b import END_ACTION, START_ACTION, action
from .common import ChatFormat
from .reasoning import COMMAND_R7B_THINK
from .syntax import SyntaxFormat, accept, alt, pattern, tool_syntax

START_TEXT, END_TEXT = "<|START_TEXT|>", "<|END_TEXT|>"
SYNTAX = tool_syntax(
    alt(
        action({"type": "string"}),  # (any id: the template writes the history's)
        accept(pattern(r"<\|START_TEXT\|>|<\|END_TEXT\|>")),  # the answer's tags: dropped
    ),
    repeat=False,
)


class Cohere2MoeFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<|START_TEXT|>`` and ``<|START_ACTION|>``."""

    name = "cohere2moe"
    tool = SYNTAX
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
