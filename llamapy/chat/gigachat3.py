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

import regex

from .common import (
    NOT_A_CALL,
    PARTIAL,
    CallParse,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolGrammar,
    assemble,
    call_from_object,
    json_rule,
    one_of,
    read_json,
)

MESSAGE_SEP, ROLE_SEP = "<|message_sep|>", "<|role_sep|>"
CALL_PREFIX = f"{MESSAGE_SEP}\n\nfunction call{ROLE_SEP}\n"
FUNCTION_CALL = "<|function_call|>"


class GigaChat3Parser(StreamParser):
    """Parser of GigaChat 3 output (``prefix``: the text before a call's JSON)."""

    think = None

    def __init__(self, syntax: ChatSyntax, prefix: str = CALL_PREFIX) -> None:
        self.prefix = prefix
        self.call_start = regex.compile(regex.escape(prefix))
        super().__init__(syntax)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        got = read_json(buf, len(self.prefix), self.json_cache)
        if got is PARTIAL:
            return NOT_A_CALL if final else None
        if got is None:
            return NOT_A_CALL
        call = call_from_object(got[0])  # type: ignore[index]
        return CallParse([call], got[1]) if call is not None else NOT_A_CALL  # type: ignore[index]


class GigaChat3Format(ChatFormat):
    """Templates with ``<|role_sep|>`` and ``<|message_sep|>`` (3.1: also ``<|function_call|>``)."""

    supports_tools = True
    think = None
    object_arguments = True
    preserved = (MESSAGE_SEP, ROLE_SEP, FUNCTION_CALL)

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.v31 = FUNCTION_CALL in self.source
        self.name = "gigachat3.1" if self.v31 else "gigachat3"
        self.prefix = FUNCTION_CALL if self.v31 else CALL_PREFIX

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
        if self.v31:
            head = req.lit(FUNCTION_CALL)
        else:
            head = f'{req.lit(MESSAGE_SEP)} "\\n\\nfunction call" {req.lit(ROLE_SEP)} "\\n"'
        rules = [f"start: {head} call", f"call: {json_rule(one_of(schemas))}"]
        triggers = () if req.required else (("word", self.prefix),)
        return ToolGrammar(assemble(rules), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return GigaChat3Parser(syntax, self.prefix)
