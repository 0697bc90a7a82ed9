"""MeetKai Functionary.

v3.2: the generation prompt ends with ``>>>``; the model writes a recipient line, ``all`` for text to
the user or a function name followed by its JSON arguments, and ``>>>`` before each further recipient:
``all\\nLet me check.>>>get_weather\\n{"location": "Paris"}``. ``python`` may be followed by raw code.

v3.1 (Llama 3.1 based): ``<function=get_weather>{"location": "Paris"}</function>``, and raw code after
``<|python_tag|>`` for ``python``.
"""

from __future__ import annotations

import json

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
    dump_arguments,
    expect_tag,
    json_rule,
    lark_str,
    read_json,
    skip_ws,
)

RECIPIENT = ">>>"
PYTHON_TAG = "<|python_tag|>"
_RECIPIENT = regex.compile(regex.escape(RECIPIENT))
_NAME_LINE = regex.compile(r">>>(\w+)\n")


def _raw_code(code: str) -> ToolCall:
    return ToolCall("python", json.dumps({"code": code}, ensure_ascii=False))


class FunctionaryV32Parser(StreamParser):
    """Parser of Functionary v3.2 output. The prompt's final ``>>>`` is put back in front of the text,
    so every recipient line is read the same way."""

    think = None
    call_start = _RECIPIENT

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._buf = RECIPIENT
        self._first = True

    def not_a_call(self, buf: str) -> int:
        if self._first:  # no recipient line: the prompt's ">>>" is not content
            self._first = False
            return len(RECIPIENT)
        return super().not_a_call(buf)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        res = self._recipient(buf, final)
        if res is not None and res.end >= 0:
            self._first = False
        return res

    def _recipient(self, buf: str, final: bool) -> CallParse | None:
        m = _NAME_LINE.match(buf, partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial:
            return None
        name, i = m.group(1), m.end()
        if name == "all":
            return CallParse([], i)
        if name == "python" and not buf.startswith("{", skip_ws(buf, i)):
            if skip_ws(buf, i) == len(buf) and not final:
                return None
            end = buf.find(RECIPIENT, i)
            if end < 0 and not final:
                return None
            end = len(buf) if end < 0 else end
            return CallParse([_raw_code(buf[i:end])], end)
        if not buf.startswith("{", i):
            return None if i == len(buf) and not final else NOT_A_CALL
        got = read_json(buf, i, self.json_cache)
        if got is PARTIAL:
            return None
        if got is None or not isinstance(got[0], dict):
            return NOT_A_CALL
        return CallParse([ToolCall(name, dump_arguments(got[0]))], got[1])


class FunctionaryV31Parser(StreamParser):
    """Parser of Functionary v3.1 output."""

    think = None
    call_start = regex.compile(r"<function=(\w+)>|" + regex.escape(PYTHON_TAG))

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        if buf.startswith(PYTHON_TAG):
            return CallParse([_raw_code(buf[len(PYTHON_TAG) :])], len(buf)) if final else None
        m = self.call_start.match(buf)
        got = read_json(buf, m.end(), self.json_cache)
        if got is PARTIAL:
            return None
        if got is None or not isinstance(got[0], dict):
            return NOT_A_CALL
        i = expect_tag(buf, got[1], "</function>", final)
        if i is None or i < 0:
            return None if i is None else NOT_A_CALL
        return CallParse([ToolCall(m.group(1), dump_arguments(got[0]))], i)


class FunctionaryV32Format(ChatFormat):
    """Templates with ``>>>all``."""

    name = "functionary-v3.2"
    supports_tools = True
    think = None
    preserved = ("<|end_header_id|>",)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules, alts = [], []
        for k, f in enumerate(req.functions):
            args = f"f{k}_args"
            rules.append(f"{args}: {json_rule(f['parameters'])}")
            if f["name"] == "python":
                rules.append(f"{args}_raw: /[^{{](?s:.*)/")
                args = f"({args} | {args}_raw)"
            line = lark_str(f["name"] + "\n")
            alts.append(f"{line} {args}")
        first = "call"
        more = f'({WS} ">>>" call)*' if req.parallel else ""
        rules = [f"start: {first} {more}", f"call: {' | '.join(alts)}", *rules]
        triggers: tuple[tuple[str, str], ...] = ()
        if not req.required:
            names = "|".join(regex.escape(f["name"]) for f in req.functions)
            triggers = (
                ("pattern_full", rf"^((?:{names})\n)[\s\S]*"),
                ("pattern", rf">>>((?:{names})\n)"),
            )
        return ToolGrammar(assemble(rules), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return FunctionaryV32Parser(syntax)


class FunctionaryV31Format(ChatFormat):
    """Llama 3.1 templates with ``<function=`` (Functionary v3.1)."""

    name = "functionary-v3.1-llama-3.1"
    supports_tools = True
    think = None
    object_arguments = True
    preserved = (PYTHON_TAG,)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        rules, alts = [], []
        for k, f in enumerate(req.functions):
            rules.append(f"f{k}_args: {json_rule(f['parameters'])}")
            head = lark_str(f"<function={f['name']}>")
            alts.append(f'{head} f{k}_args "</function>"')
            if f["name"] in ("python", "ipython"):
                alts.append(f"{req.lit(PYTHON_TAG)} /(?s:.*)/")
        rules = [f"start: {req.calls('call')}", f"call: {' | '.join(alts)}", *rules]
        triggers = () if req.required else (("word", "<function="), ("word", PYTHON_TAG))
        return ToolGrammar(assemble(rules), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return FunctionaryV31Parser(syntax)
