"""GigaChat 3 / 3.1: one call per turn, a JSON object in a ``function call`` message (3.1: after a
``<|function_call|>`` token)

```
The weather?<|message_sep|>

function call<|role_sep|>
{"name": "get_weather", "arguments": {"location": "Paris"}}
```

As llama.cpp's handler, parallel calls are not supported (one call at most) and there is no reasoning.
"""

from __future__ import annotations

from .common import ChatFormat
from .syntax import SyntaxFormat, ToolSyntax, json_calls, lit, seq, tool_syntax, ws

MESSAGE_SEP, ROLE_SEP = "<|message_sep|>", "<|role_sep|>"
CALL_PREFIX = f"{MESSAGE_SEP}\n\nfunction call{ROLE_SEP}\n"
FUNCTION_CALL = "<|function_call|>"


def gigachat_syntax(prefix: str) -> ToolSyntax:
    """One JSON call after ``prefix`` (the special tokens in it written as tokens)."""
    call = seq(lit(prefix), ws(""), json_calls(one=True, keys=("arguments",)))
    return tool_syntax(call, repeat=False, tokens=(MESSAGE_SEP, ROLE_SEP, FUNCTION_CALL))


class GigaChat3Format(SyntaxFormat, ChatFormat):
    """Templates with ``<|role_sep|>`` and ``<|message_sep|>`` (3.1: also ``<|function_call|>``)."""

    think = None
    object_arguments = True
    preserved = (MESSAGE_SEP, ROLE_SEP, FUNCTION_CALL)

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.v31 = FUNCTION_CALL in self.source
        self.name = "gigachat3.1" if self.v31 else "gigachat3"
        self.prefix = FUNCTION_CALL if self.v31 else CALL_PREFIX
        self.tool = gigachat_syntax(self.prefix)
