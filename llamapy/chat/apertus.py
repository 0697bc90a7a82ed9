"""Swiss AI Apertus: calls as a JSON array of ``{"NAME": {arguments}}`` objects between
``<|tools_prefix|>`` and ``<|tools_suffix|>``, reasoning in ``<|inner_prefix|>...<|inner_suffix|>``

```
<|inner_prefix|>The user wants the weather.<|inner_suffix|><|tools_prefix|>[{"get_weather": {"location": "Paris"}}]<|tools_suffix|>
```
"""

from __future__ import annotations

from typing import Any

from .common import ChatFormat, ToolCall, dump_arguments
from .reasoning import ThinkTags
from .syntax import SyntaxFormat, end_tag, json_calls, lit, seq, tool_syntax, ws

APERTUS_THINK = ThinkTags("<|inner_prefix|>", "<|inner_suffix|>")
TOOLS_PREFIX, TOOLS_SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"


def _item(f: dict) -> dict:
    return {
        "type": "object",
        "properties": {f["name"]: f["parameters"]},
        "required": [f["name"]],
        "additionalProperties": False,
    }


def _read(item: Any) -> ToolCall | None:
    if not isinstance(item, dict) or len(item) != 1:
        return None
    ((name, args),) = item.items()
    return ToolCall(name, dump_arguments(args)) if isinstance(args, dict) else None


# a JSON array of {"NAME": {arguments}} between the two tags
CALLS = json_calls(array=True, only_array=True, comma=False, item=_item, read=_read)
SYNTAX = tool_syntax(seq(lit(TOOLS_PREFIX, True), ws(), CALLS, end_tag(TOOLS_SUFFIX, True)), repeat=False)


class ApertusFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<|tools_prefix|>`` and ``<|tools_suffix|>``."""

    name = "apertus"
    tool = SYNTAX
    think = APERTUS_THINK
    preserved = (TOOLS_PREFIX, TOOLS_SUFFIX, APERTUS_THINK.start, APERTUS_THINK.end)
