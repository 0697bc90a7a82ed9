"""IBM Granite 3.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}]``, reasoning in ``<think>``, the
answer optionally wrapped in ``<response>...</response>`` (the tags are dropped)."""

from __future__ import annotations

from .common import ChatFormat
from .reasoning import THINK
from .syntax import SyntaxFormat, alt, drop, json_calls, lit, pattern, seq, tool_syntax, ws

TOOL_CALL = "<|tool_call|>"
SYNTAX = tool_syntax(
    alt(
        seq(
            lit(TOOL_CALL, True),
            ws(""),
            json_calls(array=True, only_array=True, comma=False, keys=("arguments",)),
        ),
        drop(pattern(r"</?response>")),  # the answer's wrapping tags: dropped
    ),
    repeat=False,
)


class GraniteFormat(SyntaxFormat, ChatFormat):
    """Templates with ``elif thinking`` and ``<|tool_call|>`` (Granite 3.2, 3.3)."""

    name = "granite"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = ("<think>", "</think>", "<response>", "</response>", TOOL_CALL)
