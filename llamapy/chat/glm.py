"""GLM 4.5 / 4.6 / 4.7 (also Ling 3.0, Spark 2.5, Laguna): XML-style calls with ``<arg_key>`` / ``<arg_value>`` pairs

```
<tool_call>get_weather
<arg_key>location</arg_key>
<arg_value>Paris</arg_value>
<arg_key>days</arg_key>
<arg_value>3</arg_value>
</tool_call>
```

GLM 4.7 writes the same without the newlines; the name follows ``<tool_call>`` directly and, when the
request's tools are known, must be one of them. Values are text; as llama.cpp, a value becomes JSON when
it parses as JSON, except that a parameter whose schema says ``string`` stays a string (the request's
tools are in ``ChatSyntax.tools``). Reasoning: ``<think>``; GLM 4.7's prompt opens the block itself.
"""

from __future__ import annotations

from .common import WS, ChatFormat, lark_str
from .reasoning import THINK
from .syntax import Lark, SyntaxFormat, Text, end_tag, function, lit, seq, tagged_params, tool_syntax, ws

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


def _key_value(g: Lark, key: str, is_string: bool) -> str:
    lit = g.req.lit
    return f"{lit(KEY)} {lark_str(key)} {lit(KEY_END)} {WS} {lit(VALUE)}"


SYNTAX = tool_syntax(
    seq(
        lit(TOOL_CALL, True),
        function(
            "{name}",  # right after <tool_call>; one of the request's tools
            ws(),
            tagged_params(
                KEY + "{key}" + KEY_END + VALUE,
                VALUE_END,
                end_tag(TOOL_CALL_END, True, sep=""),  # (the stop may cut it off)
                value=Text(special_close=True),
                pattern=rf"{KEY}((?:(?!{KEY_END})[\s\S])*){KEY_END}\s*{VALUE}",
                open_lark=_key_value,
            ),
            name_pattern=r"[^\s<>]+",
            known=True,
        ),
    )
)


class GlmFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<tool_call>`` and ``<arg_key>``."""

    name = "glm-4.5"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", TOOL_CALL, TOOL_CALL_END, KEY, KEY_END, VALUE, VALUE_END)
