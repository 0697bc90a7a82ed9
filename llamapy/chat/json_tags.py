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

import regex

from .common import (
    NOT_A_CALL,
    PARTIAL,
    WS,
    WS1,
    CallParse,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolCall,
    ToolGrammar,
    assemble,
    call_from_object,
    call_triggers,
    expect_tag,
    json_rule,
    one_of,
    read_json,
    reasoning_prefix,
    skip_ws,
)
from .reasoning import THINK, ThinkTags

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


class JsonTagsParser(StreamParser):
    """Parser of JSON calls between ``open_tag`` and ``close_tag``."""

    def __init__(self, syntax: ChatSyntax, think: ThinkTags | None, open_tag: str, close_tag: str) -> None:
        self.think = think
        self.open_tag, self.close_tag = open_tag, close_tag
        self.call_start = regex.compile(regex.escape(open_tag))
        super().__init__(syntax)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        calls: list[ToolCall] = []
        i = len(self.open_tag)
        while True:
            j = skip_ws(buf, i)
            if buf.startswith(self.close_tag, j) or (final and j == len(buf)):
                end = expect_tag(buf, j, self.close_tag, final)
                return CallParse(calls, end) if calls and end is not None and end >= 0 else NOT_A_CALL
            if not final and self.close_tag.startswith(buf[j:]):
                return None
            got = read_json(buf, j, self.json_cache)
            if got is PARTIAL:
                return NOT_A_CALL if final else None
            if got is None:
                return NOT_A_CALL
            value, i = got  # type: ignore[misc]
            items = value if isinstance(value, list) else [value]
            found = [call_from_object(v, args_keys=("arguments", "parameters")) for v in items]
            if not found or any(c is None for c in found):
                return NOT_A_CALL
            calls.extend(found)  # type: ignore[arg-type]
            j = skip_ws(buf, i)
            if j < len(buf) and buf[j] == ",":  # objects separated by commas
                i = j + 1


class JsonTagsFormat(ChatFormat):
    """Templates whose calls are JSON between a pair of tags (see ``FAMILIES``)."""

    supports_tools = True
    object_arguments = True

    def __init__(self, source: str | None = None, family: str = "<tool_calls>") -> None:
        super().__init__(source)
        self.name, self.open_tag, self.close_tag, self.form = FAMILIES[family]
        self.think = THINK if "<think>" in self.source or "</think>" in self.source else None
        self.preserved = ("<think>", "</think>", self.open_tag, self.close_tag)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        schemas = [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in req.functions
        ]
        if self.form == "array":
            array = {"type": "array", "items": one_of(schemas), "minItems": 1}
            if not req.parallel:
                array["maxItems"] = 1
            body, rules = "calls", [f"calls: {json_rule(array)}"]
        else:
            body, rules = (
                (f"call ({WS1} call)*" if req.parallel else "call"),
                [f"call: {json_rule(one_of(schemas))}"],
            )
        prefix, extra = reasoning_prefix(req, self.think)
        start = f"start: {prefix} {req.lit(self.open_tag)} {WS} {body} {WS} {req.lit(self.close_tag)}"
        return ToolGrammar(
            assemble([start, *rules, *extra]), call_triggers(req, self.think, self.open_tag), self.preserved
        )

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return JsonTagsParser(syntax, self.think, self.open_tag, self.close_tag)
