"""Cohere Command A-style MoE (Cohere2MoE): Command R7B's calls and reasoning, the answer in
``<|START_TEXT|>...<|END_TEXT|>`` (the tags are dropped)

```
<|START_THINKING|>Let me look.<|END_THINKING|><|START_ACTION|>[
    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Paris"}}
]<|END_ACTION|>
```

The template writes the history's call ids (or fresh numbers), so the grammar takes any string id; the
parser keeps the model's ``tool_call_id`` as the call's id (as llama.cpp's handler does).
"""

from __future__ import annotations

from .command_r7b import command_syntax
from .common import ChatFormat
from .reasoning import COMMAND_R7B_THINK
from .syntax import SyntaxFormat

START_TEXT, END_TEXT = "<|START_TEXT|>", "<|END_TEXT|>"
# (any id: the template writes the history's)
SYNTAX, PRESERVED = command_syntax({"type": "string"}, (START_TEXT, END_TEXT), keep_ids=True)


class Cohere2MoeFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<|START_TEXT|>`` and ``<|START_ACTION|>``."""

    name = "cohere2moe"
    tool = SYNTAX
    think = COMMAND_R7B_THINK
    object_arguments = True
    preserved = PRESERVED
