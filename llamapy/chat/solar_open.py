"""Upstage Solar Open: ``<|think|>`` reasoning, ``<|content|>`` answers, calls between special tokens

```
<|think|>reasoning<|end|><|begin|>assistant<|content|>The answer.<|end|>
<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_weather<|tool_call:args|>{"location": "Paris"}<|tool_call:end|><|calls|>
```

(one line each; the generation prompt is ``<|begin|>assistant``). A call's id (10 lowercase letters or
digits, as the template asks) is kept as the call's id; the content wrapper and the message's own
``<|begin|>assistant`` are dropped. llama.cpp reaches this template through its autoparser, whose
analysis (0.3.36) takes the id probe ``call00001`` into the name's prefix and keeps ``<|content|>`` in
the content when tools are given: its calls never parse (see the family's test).
"""

from __future__ import annotations

from .common import WS, ChatFormat, GrammarRequest, ToolGrammar
from .reasoning import ThinkTags
from .syntax import Lark, SyntaxFormat, alt, drop, function, json_args, lit, pattern, seq, tool_syntax, ws

THINK = ThinkTags("<|think|>", "<|end|>")
BEGIN, CONTENT, END = "<|begin|>", "<|content|>", "<|end|>"
SECTION, SECTION_END = "<|tool_calls|>", "<|calls|>"
CALL, NAME, ARGS, CALL_END = (
    "<|tool_call:begin|>",
    "<|tool_call:name|>",
    "<|tool_call:args|>",
    "<|tool_call:end|>",
)
TOKENS = (BEGIN, CONTENT, END, SECTION, SECTION_END, CALL, NAME, ARGS, CALL_END, THINK.start)

SYNTAX = tool_syntax(
    alt(
        function(
            CALL + "{name}",
            json_args(),
            seq(ws(""), lit(CALL_END)),
            pattern=r"<\|tool_call:begin\|>([^<]*)<\|tool_call:name\|>([^<]+)<\|tool_call:args\|>",
            name_group=2,
            call_id=lambda m: m.group(1),
            head=lambda g, name: f"{g.text(CALL)} /[a-z0-9]{{10}}/ {g.text(NAME + name + ARGS)}",
        ),
        # the answer's wrappers: <|content|>, <|end|>, a message's <|begin|>assistant
        drop(pattern(r"<\|content\|>|<\|end\|>|<\|begin\|>assistant")),
    ),
    tokens=TOKENS,
    section=(SECTION, SECTION_END),
)


class SolarOpenFormat(SyntaxFormat, ChatFormat):
    """Templates with ``<|tool_call:begin|>``, ``<|tool_call:name|>`` and ``<|tool_call:args|>``."""

    name = "solar-open"
    tool = SYNTAX
    think = THINK
    preserved = TOKENS

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        # a lazy grammar starts at the section (or a call); one from the first token may first write a
        # reasoning message, then the calls' own <|begin|>assistant
        out = self.tool.grammar(req, None, self.preserved)
        if not req.required:
            return out
        g = Lark(req, tokens=TOKENS)
        prefix = (
            f"({g.text(THINK.start)} {g.until('think_text', THINK.end)} {g.text(BEGIN + 'assistant')} {WS})?"
        )
        return out.with_prefix(prefix, g.rules)
