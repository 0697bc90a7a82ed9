"""Swiss AI Apertus: calls as a JSON array of ``{"NAME": {arguments}}`` objects between
``<|tools_prefix|>`` and ``<|tools_suffix|>``, reasoning in ``<|inner_prefix|>...<|inner_suffix|>``

```
<|inner_prefix|>The user wants the weather.<|inner_suffix|><|tools_prefix|>[{"get_weather": {"location": "Paris"}}]<|tools_suffix|>
```
"""

from __future__ import annotations

import regex

from .common import (
    NOT_A_CALL,
    PARTIAL,
    WS,
    CallParse,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolCall,
    ToolGrammar,
    assemble,
    call_triggers,
    dump_arguments,
    expect_tag,
    json_rule,
    one_of,
    read_json,
    reasoning_prefix,
)
from .reasoning import ThinkTags

APERTUS_THINK = ThinkTags("<|inner_prefix|>", "<|inner_suffix|>")
TOOLS_PREFIX, TOOLS_SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"


class ApertusParser(StreamParser):
    """Parser of Apertus output."""

    think = APERTUS_THINK
    call_start = regex.compile(regex.escape(TOOLS_PREFIX))

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        got = read_json(buf, len(TOOLS_PREFIX), self.json_cache)
        if got is PARTIAL:
            return NOT_A_CALL if final else None
        if got is None or not isinstance(got[0], list) or not got[0]:  # type: ignore[index]
            return NOT_A_CALL
        calls = []
        for item in got[0]:  # type: ignore[index]
            if not isinstance(item, dict) or len(item) != 1:
                return NOT_A_CALL
            ((name, args),) = item.items()
            if not isinstance(args, dict):
                return NOT_A_CALL
            calls.append(ToolCall(name, dump_arguments(args)))
        end = expect_tag(buf, got[1], TOOLS_SUFFIX, final)  # type: ignore[index]
        if end is None or end < 0:
            return None if end is None else NOT_A_CALL
        return CallParse(calls, end)


class ApertusFormat(ChatFormat):
    """Templates with ``<|tools_prefix|>`` and ``<|tools_suffix|>``."""

    name = "apertus"
    supports_tools = True
    think = APERTUS_THINK
    preserved = (TOOLS_PREFIX, TOOLS_SUFFIX, APERTUS_THINK.start, APERTUS_THINK.end)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        item = one_of(
            [
                {
                    "type": "object",
                    "properties": {f["name"]: f["parameters"]},
                    "required": [f["name"]],
                    "additionalProperties": False,
                }
                for f in req.functions
            ]
        )
        schema: dict = {"type": "array", "items": item, "minItems": 1}
        if not req.parallel:
            schema["maxItems"] = 1
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [
            f"start: {prefix} {req.lit(TOOLS_PREFIX)} {WS} calls {WS} {req.lit(TOOLS_SUFFIX)}",
            f"calls: {json_rule(schema)}",
            *extra,
        ]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, TOOLS_PREFIX), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return ApertusParser(syntax)
