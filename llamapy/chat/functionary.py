"""MeetKai Functionary.

v3.2: the generation prompt ends with ``>>>``; the model writes a recipient line, ``all`` for text to
the user or a function name followed by its JSON arguments, and ``>>>`` before each further recipient:
``all\\nLet me check.>>>get_weather\\n{"location": "Paris"}``. ``python`` may be followed by raw code.

v3.1 (Llama 3.1 based): ``<function=get_weather>{"location": "Paris"}</function>``, and raw code after
``<|python_tag|>`` for ``python``.
"""

from __future__ import annotations

import regex

from .common import WS, CallParse, ChatFormat, ChatSyntax, GrammarRequest, lark_str
from .syntax import (
    SyntaxFormat,
    SyntaxParser,
    ToolSyntax,
    alt,
    code,
    drop,
    end_tag,
    function,
    json_args,
    lit,
    seq,
    tool_syntax,
)

RECIPIENT = ">>>"
PYTHON_TAG = "<|python_tag|>"


def _v32_triggers(req: GrammarRequest) -> tuple[tuple[str, str], ...]:
    """A recipient line naming a function: at the start (the prompt wrote ``>>>``) or after ``>>>``."""
    names = "|".join(regex.escape(f["name"]) for f in req.functions)
    return (("pattern_full", rf"^((?:{names})\n)[\s\S]*"), ("pattern", rf">>>((?:{names})\n)"))


# a recipient line (the grammar's first one is in the prompt), then JSON arguments or python's raw code
V32 = tool_syntax(
    alt(
        drop(lit(RECIPIENT + "all\n")),  # text to the user follows
        function(
            RECIPIENT + "{name}\n",
            alt(json_args(), code(RECIPIENT, guard=r"\s*\{", gen="/[^{](?s:.*)/")),
            name_pattern=r"\w+",
            head=lambda g, name: lark_str(name + "\n"),
        ),
    ),
    sep=f'{WS} "{RECIPIENT}"',
    start=_v32_triggers,
)
V31 = tool_syntax(
    alt(
        function("<function={name}>", json_args(), end_tag("</function>", sep=""), name_pattern=r"\w+"),
        seq(lit(PYTHON_TAG, True), code(call=True, gen="/(?s:.*)/", names=("python", "ipython"))),
    )
)


class FunctionaryV32Parser(SyntaxParser):
    """Parser of Functionary v3.2 output. The prompt's final ``>>>`` is put back in front of the text,
    so every recipient line is read the same way."""

    def __init__(self, syntax: ChatSyntax, tool: ToolSyntax, think: None) -> None:
        super().__init__(syntax, tool, think)
        self._buf = RECIPIENT
        self._first = True

    def not_a_call(self, buf: str) -> int:
        if self._first:  # no recipient line: the prompt's ">>>" is not content
            self._first = False
            return len(RECIPIENT)
        return super().not_a_call(buf)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        res = super().parse_call(buf, final)
        if res is not None and res.end >= 0:
            self._first = False
        return res


class FunctionaryV32Format(SyntaxFormat, ChatFormat):
    """Templates with ``>>>all``."""

    name = "functionary-v3.2"
    tool = V32
    parser_class = FunctionaryV32Parser
    think = None
    preserved = ("<|end_header_id|>",)


class FunctionaryV31Format(SyntaxFormat, ChatFormat):
    """Llama 3.1 templates with ``<function=`` (Functionary v3.1)."""

    name = "functionary-v3.1-llama-3.1"
    tool = V31
    think = None
    object_arguments = True
    preserved = (PYTHON_TAG,)
