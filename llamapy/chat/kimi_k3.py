"""Kimi K3: XTML sections, ``<|open|>TAG attrs<|sep|>`` ... ``<|close|>TAG<|sep|>``

```
<|open|>think<|sep|>reasoning<|close|>think<|sep|><|open|>response<|sep|>answer<|close|>response<|sep|>
<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>
<|open|>argument key="location" type="string"<|sep|>Paris<|close|>argument<|sep|>
<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>
<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>
```

(one line, no newlines). As llama.cpp's ``kimi-k3.cpp``: the generation prompt opens the ``think``
section (or, thinking off, the ``response`` one); the response's tags, the message closer and
``<|end_of_msg|>`` are dropped; an argument's value is text, JSON unless its schema says string (the
``type`` attribute is not used); the template wants assistant call arguments as objects (it writes one
``argument`` tag per key).
"""

from __future__ import annotations

import regex

from .common import WS, ChatFormat, GrammarRequest, ToolGrammar
from .reasoning import ThinkTags
from .syntax import Lark, SyntaxFormat, Text, alt, drop, function, lit, pattern, tagged_params, tool_syntax

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
THINK = ThinkTags(f"{OPEN}think{SEP}", f"{CLOSE}think{SEP}")
TOOLS, TOOLS_END = f"{OPEN}tools{SEP}", f"{CLOSE}tools{SEP}"
CALL_END, ARG_END = f"{CLOSE}call{SEP}", f"{CLOSE}argument{SEP}"
# the answer's wrappers, dropped: the assistant message's opener and closer, the response's tags
WRAPPERS = (f'{OPEN}message role="assistant"{SEP}', f"{OPEN}response{SEP}", f"{CLOSE}response{SEP}")
TRAILER = f"{CLOSE}message{SEP}"
TOKENS = (OPEN, CLOSE, SEP, EOM)
_ATTRS = r"[^<]*"  # the rest of a tag's attributes, up to <|sep|>


def _arg_head(g: Lark, key: str, is_string: bool) -> str:
    assert g.function is not None
    schema = (g.function["parameters"].get("properties") or {}).get(key)
    kind = schema.get("type") if isinstance(schema, dict) else None
    kind = "string" if is_string else {"integer": "number"}.get(kind, kind)  # (the template's xtml_type)
    head = g.text(f'{OPEN}argument key="{key}" type="')
    tail = g.text(f'"{SEP}')
    return f"{head} {g.text(kind)} {tail}" if isinstance(kind, str) else f"{head} /[a-z]+/ {tail}"


def _call_head(g: Lark, name: str) -> str:
    head = g.text(f'{OPEN}call tool="{name}" index="')
    return f"{head} /[0-9]+/ {g.text(chr(34) + SEP)}"


class _Value(Text):
    """An argument's text up to ``<|close|>argument<|sep|>``, whose markers may be special tokens."""

    def lark_string(self, g: Lark, close: str) -> str:
        return g.until("str_value", close)


SYNTAX = tool_syntax(
    alt(
        function(
            f'{OPEN}call tool="{{name}}"',
            tagged_params(
                f'{OPEN}argument key="{{key}}"',
                ARG_END,
                lit(CALL_END),
                sep='""',
                pattern=rf'{regex.escape(OPEN)}argument key="([^"]*)"{_ATTRS}{regex.escape(SEP)}',
                open_lark=_arg_head,
                value=_Value(),
            ),
            pattern=rf'{regex.escape(OPEN)}call tool="([^"]*)"{_ATTRS}{regex.escape(SEP)}',
            head=_call_head,
        ),
        drop(pattern("|".join(regex.escape(t) for t in (*WRAPPERS, TRAILER, EOM)))),
    ),
    tokens=TOKENS,
    sep='""',
    section=(TOOLS, TOOLS_END),
)


class KimiK3Format(SyntaxFormat, ChatFormat):
    """Templates with ``<|open|>``, ``<|close|>`` and ``<|end_of_msg|>``."""

    name = "kimi-k3"
    tool = SYNTAX
    think = THINK
    object_arguments = True
    preserved = TOKENS

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        # a lazy grammar starts at <|open|>tools<|sep|> (llama.cpp's trigger, wherever it stands); one
        # from the first token may first close (or open) the think section and write a response
        out = self.tool.grammar(req, None, self.preserved)
        if not req.required:
            return out
        g = Lark(req, tokens=TOKENS)
        think, resp = g.until("k3_think", THINK.end), g.until("k3_response", WRAPPERS[2])
        if not req.thinking_forced_open:
            think = f"({g.text(THINK.start)} {think})?"
        prefix = f"{think} {WS} ({g.text(WRAPPERS[1])} {resp} {WS})?"
        return out.with_prefix(prefix, g.rules)
