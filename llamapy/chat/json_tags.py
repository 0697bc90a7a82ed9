"""JSON calls between a pair of tags: Nemotron Nano v2 (``<TOOLCALL>[...]</TOOLCALL>``), Apriel 1.6
(``<tool_calls>[...]</tool_calls>``) and MiniMax M1 (``<tool_calls>`` holding one JSON object a line)

```
<TOOLCALL>[{"name": "get_weather", "arguments": {"location": "Paris"}}]</TOOLCALL>
<tool_calls>
{"name": "get_weather", "arguments": {"location": "Paris"}}
</tool_calls>
```

The parser takes a JSON array or a sequence of objects inside the tags. Reasoning: ``<think>`` where
the template has it (Apriel's own "reasoning steps" prefix is not split from the content).
"""

from __future__ import annotations

from .common import WS1, ChatFormat
from .reasoning import THINK, ThinkTags
from .syntax import SyntaxFormat, ToolSyntax, end_tag, json_calls, lit, repeat, seq, tool_syntax, ws

# template marker -> (name, open tag, close tag, the grammar's form: "array" or "lines")
FAMILIES = {
    "<TOOLCALL>": ("nemotron-v2", "<TOOLCALL>", "</TOOLCALL>", "array"),
    "<beginning_of_sentence>": ("minimax-m1", "<tool_calls>", "</tool_calls>", "lines"),
    "<tool_calls>": ("apriel", "<tool_calls>", "</tool_calls>", "array"),
}


def family_of(source: str) -> str | None:
    """The FAMILIES key whose syntax the template ``source`` uses, or None."""
    if "<TOOLCALL>" in source and "</TOOLCALL>" in source:
        return "<TOOLCALL>"
    if "<tool_calls>" in source and "</tool_calls>" in source:
        return "<beginning_of_sentence>" if "<beginning_of_sentence>" in source else "<tool_calls>"
    return None


def json_tags_syntax(open_tag: str, close_tag: str, form: str) -> ToolSyntax:
    """JSON calls between ``open_tag`` and ``close_tag``: an array (``form`` "array") or objects one a
    line ("lines") in the grammar; the parser takes either, objects also separated by commas."""
    calls = repeat(json_calls(array=form == "array"), end_tag(close_tag, True), sep=WS1, once=form == "array")
    return tool_syntax(seq(lit(open_tag, True), ws(), calls), repeat=False)


class JsonTagsFormat(SyntaxFormat, ChatFormat):
    """Templates whose calls are JSON between a pair of tags (see ``FAMILIES``)."""

    object_arguments = True

    def __init__(self, source: str | None = None, family: str = "<tool_calls>") -> None:
        super().__init__(source)
        self.name, self.open_tag, self.close_tag, self.form = FAMILIES[family]
        self.think = THINK if "<think>" in self.source or "</think>" in self.source else None
        self.preserved = ("<think>", "</think>", self.open_tag, self.close_tag)
        self.tool = json_tags_syntax(self.open_tag, self.close_tag, self.form)

    def parser_think(self) -> ThinkTags | None:  # (reasoning only where the template has it)
        return self.think
