"""Tencent Hy3 (Hunyuan 3): GLM-style ``<arg_key>`` / ``<arg_value>`` calls in a ``<tool_calls>`` block,
every tag carrying the template's suffix (``HYTK``, ``:opensource``)

```
<tool_calls:opensource>
<tool_call:opensource>get_weather<tool_sep:opensource>
<arg_key:opensource>location</arg_key:opensource>
<arg_value:opensource>Paris</arg_value:opensource>
<arg_key:opensource>days</arg_key:opensource>
<arg_value:opensource>3</arg_value:opensource>
</tool_call:opensource>
</tool_calls:opensource>
```

As llama.cpp's autoparser derives it from the template: reasoning in ``<think:opensource>`` (the
generation prompt opens it for ``reasoning_effort`` low / high, and writes it closed for ``no_think``, the
default); content before the block; a value is text, JSON unless its schema says string; the template
wants assistant call arguments as objects (one key/value pair per argument); the lazy grammar starts at
``<tool_calls:opensource>``. The parser also reads the tags without the newlines between them (llama.cpp's
autoparser needs the template's exact newlines: its section start is ``<tool_calls:opensource>\\n``).
"""

from __future__ import annotations

import regex

from .common import WS, ChatFormat, lark_str
from .reasoning import ThinkTags
from .syntax import (
    Lark,
    SyntaxFormat,
    Text,
    ToolSyntax,
    end_tag,
    function,
    lit,
    repeat,
    seq,
    tagged_params,
    tool_syntax,
    ws,
)

DEFAULT_SUFFIX = ":opensource"
_HYTK = regex.compile(r"""set\s+HYTK\s*=\s*(['"])([^'"]*)\1""")
_LITERAL = regex.compile(r"<tool_sep([^<>{}]*)>")


def suffix_of(src: str) -> str:
    """The template's tag suffix: its ``HYTK`` variable, else the one its literal ``<tool_sep...>`` has."""
    m = _HYTK.search(src) or _LITERAL.search(src)
    if m is None:
        return DEFAULT_SUFFIX
    return m.group(m.lastindex or 0)


def is_hy3(src: str) -> bool:
    """Hy3's tags, written with ``{}`` for the suffix (``'<tool_calls{}>'.format(HYTK)``) or literally."""
    return all(f"<{t}" in src for t in ("tool_calls", "tool_sep", "arg_key", "arg_value"))


class _Tags:
    """The family's tags with one suffix."""

    def __init__(self, suffix: str) -> None:
        def tag(name: str) -> str:
            return f"<{name}{suffix}>"

        self.think = ThinkTags(tag("think"), tag("/think"))
        self.block, self.block_end = tag("tool_calls"), tag("/tool_calls")
        self.call, self.sep, self.call_end = tag("tool_call"), tag("tool_sep"), tag("/tool_call")
        self.key, self.key_end = tag("arg_key"), tag("/arg_key")
        self.value, self.value_end = tag("arg_value"), tag("/arg_value")
        self.tokens = (
            self.block,
            self.block_end,
            self.call,
            self.sep,
            self.call_end,
            self.key,
            self.key_end,
            self.value,
            self.value_end,
        )
        self.preserved = (self.think.start, self.think.end, *self.tokens)


def _syntax(t: _Tags) -> ToolSyntax:
    e = regex.escape

    def key_value(g: Lark, key: str, is_string: bool) -> str:
        return f"{g.req.lit(t.key)} {lark_str(key)} {g.req.lit(t.key_end)} {WS} {g.req.lit(t.value)}"

    call = function(
        t.call + "{name}" + t.sep,
        ws(),
        tagged_params(
            t.key + "{key}" + t.key_end + t.value,
            t.value_end,
            end_tag(t.call_end, True, sep=""),  # (the stop may cut it off)
            value=Text(special_close=True),
            pattern=rf"{e(t.key)}((?:(?!{e(t.key_end)})[\s\S])*){e(t.key_end)}\s*{e(t.value)}",
            open_lark=key_value,
        ),
        pattern=rf"{e(t.call)}\s*((?:(?!{e(t.sep)})[^<>])+?)\s*{e(t.sep)}",
    )
    # one block holding the calls
    block = seq(lit(t.block, True), ws(), repeat(call, end_tag(t.block_end, True)))
    return tool_syntax(block, repeat=False, tokens=t.tokens)


class Hy3Format(SyntaxFormat, ChatFormat):
    """Templates with ``<tool_calls``, ``<tool_sep``, ``<arg_key`` and ``<arg_value`` tags."""

    name = "hy3"
    object_arguments = True

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        tags = _Tags(suffix_of(self.source))
        self.think = tags.think
        self.tool = _syntax(tags)
        self.preserved = tags.preserved

    def parser_think(self) -> ThinkTags | None:
        return self.think
