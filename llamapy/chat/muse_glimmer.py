"""Muse Glimmer (ATEM): the answer is a sequence of messages, each ``to=RECIPIENT<|message|>BODY`` then
``<|eom|>`` (more follow, each after ``<|start|>assistant``) or ``<|eot|>`` (the turn ends)

```
 to=self<|message|>Thinking...<|eom|><|start|>assistant to=user<|message|>The answer.<|eot|>
 to=get_weather<|message|><atem:function_calls>
<atem:invoke name="get_weather">
<atem:parameter name="city">Paris</atem:parameter>
</atem:invoke>
</atem:function_calls><|eom|><|start|>assistant to=get_time<|message|>...
```

(the generation prompt is ``<|start|>assistant``). As llama.cpp's ``muse-glimmer.cpp``: a message to
``self`` is reasoning (content with ``reasoning_format="none"``), one to ``user`` (or to no one) content,
one to anything else a call (the function named by ``<atem:invoke>``; a parameter's value is text when its
schema says string, else JSON); with neither reasoning nor tools the whole output is content. The template
wants call arguments as objects.
"""

from __future__ import annotations

import regex

from .common import (
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    ToolGrammar,
    assemble,
    parameter_tables,
)
from .reasoning import partial_suffix
from .syntax import FAIL, NEED, Lark, Scan, function, lit, seq, tagged_params, ws

START, MESSAGE, EOM, EOT = "<|start|>", "<|message|>", "<|eom|>", "<|eot|>"
ASSISTANT = f"{START}assistant"
BLOCK, BLOCK_END = "<atem:function_calls>", "</atem:function_calls>"
INVOKE_END, PARAM_END = "</atem:invoke>", "</atem:parameter>"
PRESERVED = (
    START,
    MESSAGE,
    EOM,
    EOT,
    BLOCK,
    "<atem:invoke",
    "<atem:parameter",
    PARAM_END,
    INVOKE_END,
    BLOCK_END,
)
_TERMINATORS = (EOT, EOM)
# a message's header (the first one's ``<|start|>assistant`` is the generation prompt's)
_HEADER = regex.compile(r"(?:<\|start\|>assistant)?(?: to=([^<]*?))?<\|message\|>")

CALL = seq(
    lit(BLOCK),
    ws(),
    function(
        '<atem:invoke name="{name}">',
        ws(),
        tagged_params('<atem:parameter name="{key}">', PARAM_END, seq(lit(INVOKE_END), ws(), lit(BLOCK_END))),
        name_pattern=r'[^"]+',
    ),
)


class MuseGlimmerParser(ChatParser):
    """Parser of ATEM messages: a header, then a body up to ``<|eom|>`` / ``<|eot|>``."""

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        reasoning = syntax.reasoning_format != "none"
        tools = bool(syntax.tools) and syntax.parse_tool_calls
        self._mode = "header" if reasoning or tools else "raw"
        self._kind = ""
        self._tables = parameter_tables(syntax.tools)

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._mode == "raw":
            self._content(buf)
            self._buf = ""
            return False
        if self._mode == "header":
            if not buf:
                return False
            m = _HEADER.match(buf, partial=not final)
            if m is None:
                self._mode = "raw"
                return True
            if m.partial:
                return False
            to = (m.group(1) or "user").strip()
            if to == "self":
                self._kind = "reasoning" if self.syntax.reasoning_format != "none" else "content"
            elif to == "user":
                self._kind = "content"
            else:
                self._kind = "call"
            self._buf = buf[m.end() :]
            self._mode = "body"
            return True
        hits = [(buf.find(t), t) for t in _TERMINATORS if t in buf]
        if self._kind == "reasoning":  # (a reasoning message ends at <|eom|> only)
            hits = [h for h in hits if h[1] == EOM]
        if not hits:
            if self._kind == "call":
                if final:
                    self._close(buf)
                    self._buf = ""
                return False
            keep = 0 if final else partial_suffix(buf, *_TERMINATORS)
            self._body(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        at, _ = min(hits)
        if self._kind == "call":
            self._close(buf[:at])
        else:
            self._body(buf[:at])
        self._buf = buf[at + len(EOM) :]  # (<|eot|> is as long)
        self._mode = "header"
        return True

    def _body(self, text: str) -> None:
        if self._kind == "reasoning":
            self._reasoning(text)
        else:
            self._content(text)

    def _close(self, body: str) -> None:
        """A call message's whole body: its call, or (not one) content."""
        if self.syntax.parse_tool_calls:
            s = Scan(body, True, self._tables)
            end = CALL.parse(s, 0)
            if end is not NEED and end != FAIL and not body[end:].strip() and s.calls:
                for call in s.calls:
                    self._call(call)
                return
        self._content(body)


class MuseGlimmerFormat(ChatFormat):
    """Templates with ``<atem:function_calls>`` and ``<|eom|>``."""

    name = "muse-glimmer"
    supports_tools = True
    think = None
    object_arguments = True
    preserved = PRESERVED

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        lit_ = req.lit
        g = Lark(req, tokens=PRESERVED)
        body = CALL.lark(g)
        header = f'" to=" /[^<]*/ {lit_(MESSAGE)}'
        g.rules.insert(0, f"call: {header} {body}")
        calls = f'call ({lit_(EOM)} {lit_(START)} "assistant" call)*' if req.parallel else "call"
        if req.required:
            text = g.until("analysis_text", EOM)
            g.rules.append(f'analysis: " to=self" {lit_(MESSAGE)} {text} {lit_(START)} "assistant"')
            start = f"start: analysis* {calls}"
            triggers: tuple[tuple[str, str], ...] = ()
        else:
            start = f"start: {calls}"
            triggers = (
                (
                    "pattern",
                    r"(?:^|<\|start\|>assistant)( to=(?!self<\|message\|>)(?!user<\|message\|>)[^<]*?<\|message\|>)",
                ),
            )
        return ToolGrammar(assemble([start, *g.rules]), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return MuseGlimmerParser(syntax)
