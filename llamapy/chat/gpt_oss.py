"""OpenAI gpt-oss (the harmony format): the answer is a sequence of messages, each a header and a body

```
<|channel|>analysis<|message|>Thinking...<|end|>
<|start|>assistant<|channel|>final<|message|>The answer.
<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location": "Paris"}<|call|>
```

``analysis`` is reasoning, ``final`` and ``commentary`` (a preamble) are content, a message to
``functions.NAME`` (the recipient may also come before the channel) is a call. As llama.cpp, with
``reasoning_format="none"`` the analysis messages stay in the content with their tags; messages to
other recipients (built-in browser / python tools) are dropped.
"""

from __future__ import annotations

import regex

from .common import (
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    ToolCall,
    ToolGrammar,
    assemble,
    dump_arguments,
    lark_str,
)
from .reasoning import StrippedText, partial_suffix
from .syntax import FAIL, NEED, Lark, Node, Scan, json_args

START, CHANNEL, MESSAGE, END, CALL, CONSTRAIN = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|constrain|>",
)
_TERMINATORS = (END, CALL, "<|return|>", START)
_HEADER = regex.compile(
    r"\s*(?P<role><\|start\|>assistant)?(?: to=(?P<to1>[^\s<]+))?\s*<\|channel\|>(?P<ch>[a-z]+)"
    r"(?: to=(?P<to2>[^\s<]+))?(?:\s*(?:<\|constrain\|>)?(?P<ct>[\w-]+))?\s*<\|message\|>"
)


class Header(Node):
    """A message's header: the parser reads any message's (recipient, channel, content type; its match in
    ``Scan.match``); the grammar writes the header of a call to one of the request's functions, recipient
    in the role or in the channel, then its arguments (``ARGS``, which the parser reads from the message's
    body once the body ends)."""

    def parse(self, s: Scan, i: int) -> int | None:
        m = _HEADER.match(s.buf, i, partial=not s.final)
        if m is None:
            return FAIL
        if m.partial:
            return NEED
        s.match = m
        return m.end()

    def lark(self, g: Lark) -> str:
        lit = g.req.lit
        constrain = f'(" " {lit(CONSTRAIN)} "json")?'
        channel = '("commentary" | "analysis")'
        in_role, in_channel = [], []
        for k, f in enumerate(g.req.functions):
            g.function, g.k = f, k
            args = ARGS.lark(g)
            name = lark_str(f["name"])
            in_role.append(f"{name} {lit(CHANNEL)} {channel} {constrain} {lit(MESSAGE)} {args}")
            in_channel.append(f"{name} {constrain} {lit(MESSAGE)} {args}")
        g.function = None
        g.rules[:0] = [
            f'in_role: " to=functions." ({" | ".join(in_role)})',
            f'in_channel: {lit(CHANNEL)} {channel} " to=functions." ({" | ".join(in_channel)})',
        ]
        return "in_role | in_channel"

    def start(self) -> tuple[str, bool]:
        return _HEADER.pattern, True


HEADER, ARGS = Header(), json_args()


class GptOssParser(ChatParser):
    """Parser of harmony messages."""

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._mode = "header"
        self._kind = ""
        self._name = ""
        self._strip = StrippedText()

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._mode == "raw":
            self._content(buf)
            self._buf = ""
            return False
        if self._mode == "header":
            if not buf:
                return False
            s = Scan(buf, final)
            end = HEADER.parse(s, 0)
            if end == FAIL:
                self._mode = "raw"
                return True
            if end is NEED:
                return False
            m = s.match
            self._open(m, buf[m.end("role") if m.group("role") else m.start() : end].lstrip())
            self._buf = buf[end:]
            self._mode = "body"
            return True
        hits = [(buf.find(t), t) for t in _TERMINATORS if t in buf]
        if not hits:
            if self._kind in ("content", "reasoning", "raw_reasoning"):
                keep = 0 if final else partial_suffix(buf, *_TERMINATORS)
                self._body(buf[: len(buf) - keep])
                self._buf = buf[len(buf) - keep :]
            elif final:
                self._close(buf, "")
                self._buf = ""
            return False
        at, term = min(hits)
        if self._kind in ("content", "reasoning", "raw_reasoning"):
            self._body(buf[:at])
        self._close(buf[:at], term)
        self._buf = buf[at + (0 if term == START else len(term)) :]
        self._mode = "header"
        return True

    def _open(self, m: regex.Match, header: str) -> None:
        to = m.group("to1") or m.group("to2")
        self._name = ""
        if to:
            self._kind = "call" if to.startswith("functions.") else "drop"
            self._name = to[len("functions.") :]
        elif m.group("ch") == "analysis":
            if self.syntax.reasoning_format == "none":
                self._kind = "raw_reasoning"
                self._content(header)  # as llama.cpp: the header, without "<|start|>assistant"
            else:
                self._kind = "reasoning"
                self._strip.open()
        elif m.group("ch") in ("final", "commentary"):
            self._kind = "content"
        else:
            self._kind = "drop"

    def _body(self, text: str) -> None:
        if self._kind == "reasoning":
            self._reasoning(self._strip.push(text))
        else:
            self._content(text)

    def _close(self, body: str, term: str) -> None:
        if self._kind == "raw_reasoning" and term == END:
            self._content(END)
        elif self._kind == "call" and self.syntax.parse_tool_calls:
            s = Scan(body, True)
            end = ARGS.parse(s, 0)
            if end is not NEED and end != FAIL and not body[end:].strip():
                self._call(ToolCall(self._name, dump_arguments(s.args)))
            else:
                self._content(body)


class GptOssFormat(ChatFormat):
    """Templates with ``<|channel|>``."""

    name = "gpt-oss"
    supports_tools = True
    think = None
    object_arguments = True
    preserved = (CHANNEL, CONSTRAIN, MESSAGE, START, END)

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        """``reasoning_content`` as the template's ``thinking``; with tool calls the content is dropped
        (the template refuses both, as llama.cpp's gpt-oss handler does)."""
        out = super().prepare_messages(messages, tools)
        for m in out:
            if isinstance(m.get("reasoning_content"), str):
                m["thinking"] = m["reasoning_content"]
                if m.get("tool_calls"):
                    m["content"] = ""
        return out

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        lit, g = req.lit, Lark(req)
        call = HEADER.lark(g)
        rules = g.rules
        if req.required:
            text, extra = req.until("message_text", END)
            rules += [
                f'analysis: {lit(CHANNEL)} "analysis" {lit(MESSAGE)} {text} {lit(START)} "assistant"',
                f'preamble: {lit(CHANNEL)} "commentary" {lit(MESSAGE)} {text} {lit(START)} "assistant"',
                *extra,
            ]
            start = f"start: analysis? preamble? ({call})"
            triggers: tuple[tuple[str, str], ...] = ()
        else:
            start = f"start: {call}"
            triggers = (
                ("pattern", r"(<\|channel\|>(?:commentary|analysis) to=functions\.)"),
                ("pattern", r"<\|start\|>assistant( to=functions\.)"),
                ("pattern_full", r"^( to=functions\.)[\s\S]*"),
            )
        return ToolGrammar(assemble([start, *rules]), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return GptOssParser(syntax)
