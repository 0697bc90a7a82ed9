"""Google Gemma 4: thinking in ``<|channel>thought ... <channel|>`` blocks, calls in Gemma's own dict syntax

```
<|channel>thought
The user wants the weather.<channel|><|tool_call>call:get_weather{days:3,location:<|"|>Paris<|"|>}<tool_call|>
```

Argument keys are bare, strings are quoted with ``<|"|>``, numbers, ``true``/``false``/``null``, ``[...]``
and ``{...}`` as in JSON. As llama.cpp's Gemma 4 handler (``common/parsers/gemma4.cpp``), a thought block
may come anywhere (it is reasoning; a ``<|channel>`` not followed by ``thought`` and a stray
``<channel|>`` are dropped), an optional ``<|turn>model\\n`` at the start is dropped, and with
``reasoning_format="none"`` the blocks stay in the content with their tags. The template renders the
tools itself; the older template (no ``role: tool`` support) gets the tool results folded into the
calling assistant message as ``tool_responses``. The grammar types each argument by its JSON schema
(keys of the schema, in any order; required keys are not enforced).
"""

from __future__ import annotations

import json
from typing import Any

import regex

from .common import (
    NUMBER,
    NUMBER_PREFIX,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    ToolCall,
    ToolGrammar,
    assemble,
    expect_tag,
    lark_str,
    reasoning_prefix,
    skip_ws,
)
from .reasoning import StrippedText, ThinkTags, partial_suffix
from .syntax import FAIL, NEED, Lark, Node, Scan

CHANNEL, CHANNEL_END, TOOL_CALL, TOOL_CALL_END, TURN = (
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|turn>",
)
QUOTE = '<|"|>'
THOUGHT = "thought"
GEMMA4_THINK = ThinkTags(CHANNEL, CHANNEL_END)  # for grammars: the block's text includes "thought"
_MODEL_TURN = "<|turn>model\n"
_NEW_TEMPLATE = "{#- OpenAI Chat Completions:"  # templates that render role: tool messages themselves

_KEY = regex.compile(r"[^:{}\[\],<]+")
_NAME = regex.compile(r"call:([^{}<>\s]+)(?=\{)")
_NAME_PREFIX = regex.compile(r"(?:c(?:a(?:l(?:l(?::[^{}<>\s]*)?)?)?)?)?")


# --- Gemma values -> JSON text ---


class _More(Exception):
    """The text stops inside the value."""


class _Bad(Exception):
    """Not a Gemma value."""


def _quoted(t: str, i: int) -> tuple[str, int]:
    e = t.find(QUOTE, i + len(QUOTE))
    if e < 0:
        raise _More
    return t[i + len(QUOTE) : e], e + len(QUOTE)


def _value(t: str, i: int) -> tuple[str, int]:
    n = len(t)
    i = skip_ws(t, i)
    if i >= n:
        raise _More
    if t.startswith(QUOTE, i):
        s, i = _quoted(t, i)
        return json.dumps(s, ensure_ascii=False), i
    c = t[i]
    if c == "<" and QUOTE.startswith(t[i:]):
        raise _More
    if c == "{":
        return _dict(t, i)
    if c == "[":
        i = skip_ws(t, i + 1)
        items: list[str] = []
        if i < n and t[i] == "]":
            return "[]", i + 1
        while True:
            v, i = _value(t, i)
            items.append(v)
            done, i = _next_item(t, i, "]")
            if done:
                return "[" + ", ".join(items) + "]", i
    if c == "-" or c.isdigit():
        if NUMBER_PREFIX.fullmatch(t, i):  # the text ends inside a number
            raise _More
        m = NUMBER.match(t, i)
        if m is None:
            raise _Bad
        return m.group(), m.end()
    for lit in ("true", "false", "null"):
        if t.startswith(lit, i):
            return lit, i + len(lit)
        if lit.startswith(t[i:]):
            raise _More
    raise _Bad


def _next_item(t: str, i: int, close: str) -> tuple[bool, int]:
    """After an item of a list or dict: whether ``close`` ends it, and the index after it or the comma."""
    i = skip_ws(t, i)
    if i >= len(t):
        raise _More
    if t[i] == close:
        return True, i + 1
    if t[i] != ",":
        raise _Bad
    return False, i + 1


def _dict(t: str, i: int) -> tuple[str, int]:
    n = len(t)
    i = skip_ws(t, i + 1)
    if i >= n:
        raise _More
    if t[i] == "}":
        return "{}", i + 1
    parts: list[str] = []
    while True:
        i = skip_ws(t, i)
        if i >= n:
            raise _More
        if t.startswith(QUOTE, i):
            key, i = _quoted(t, i)
        elif QUOTE.startswith(t[i:]):
            raise _More
        else:
            m = _KEY.match(t, i)
            if m is None or not m.group().strip():
                raise _Bad
            if m.end() >= n:
                raise _More
            key, i = m.group().strip(), m.end()
        i = skip_ws(t, i)
        if i >= n:
            raise _More
        if t[i] != ":":
            raise _Bad
        v, i = _value(t, i + 1)
        parts.append(json.dumps(key, ensure_ascii=False) + ": " + v)
        done, i = _next_item(t, i, "}")
        if done:
            return "{" + ", ".join(parts) + "}", i


PARTIAL_VALUE = object()


def read_gemma_value(text: str, pos: int = 0) -> tuple[str, int] | object | None:
    """The Gemma value at ``text[pos:]`` as JSON text and the index after it; ``PARTIAL_VALUE`` when the
    text stops inside a valid value; None when it is not one."""
    try:
        return _value(text, pos)
    except _More:
        return PARTIAL_VALUE
    except _Bad:
        return None
    except RecursionError:
        return None


# --- parser ---


class Gemma4Parser(ChatParser):
    """Parser of Gemma 4 output: content, thought blocks anywhere, ``<|tool_call>`` calls."""

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._raw = syntax.reasoning_format == "none"
        self._strip = StrippedText()
        self._lstrip = False  # drop whitespace before the first content (after a thought block)
        self._mode = "start"
        if syntax.thinking_forced_open:
            self._open_thought()
        self._markers = (
            (CHANNEL, CHANNEL_END, TOOL_CALL) if syntax.parse_tool_calls else (CHANNEL, CHANNEL_END)
        )

    def _open_thought(self) -> None:
        self._strip.open()
        self._mode = "think"

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._mode == "start":
            if buf.startswith(_MODEL_TURN):
                self._buf = buf[len(_MODEL_TURN) :]
            elif not final and _MODEL_TURN.startswith(buf):
                return False
            self._mode = "content"
            return True
        if self._mode == "think":
            end = buf.find(CHANNEL_END)
            if end < 0:
                keep = 0 if final else partial_suffix(buf, CHANNEL_END)
                self._think_text(buf[: len(buf) - keep], closed=False)
                self._buf = buf[len(buf) - keep :]
                return False
            self._think_text(buf[:end], closed=True)
            self._buf = buf[end + len(CHANNEL_END) :]
            self._mode = "content"
            self._lstrip = not self._msg.content
            return True
        if self._mode == "call":
            return self._step_call(buf, final)
        # content
        if self._lstrip:
            buf = self._buf = buf.lstrip()
            if not buf:
                return False
            self._lstrip = False
        hits = [(buf.find(m), m) for m in self._markers if m in buf]
        if not hits:
            keep = 0 if final else partial_suffix(buf, *self._markers)
            self._content(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        at, marker = min(hits)
        self._content(buf[:at])
        rest = buf[at + len(marker) :]
        if marker == CHANNEL_END:  # a stray end of block
            self._buf = rest
            return True
        if marker == TOOL_CALL:
            self._buf = buf[at:]
            self._mode = "call"
            return True
        if rest.startswith(THOUGHT):
            self._buf = rest[len(THOUGHT) :]
            if self._raw:
                self._content(CHANNEL + THOUGHT)
            self._open_thought()
            return True
        if not final and THOUGHT.startswith(rest):
            self._buf = buf[at:]
            return False
        self._buf = rest  # an empty channel marker: dropped
        return True

    def _think_text(self, text: str, closed: bool) -> None:
        if self._raw:
            self._content(text + (CHANNEL_END if closed else ""))
        else:
            self._reasoning(self._strip.push(text))

    def _step_call(self, buf: str, final: bool) -> bool:
        s = Scan(buf, final)
        end = CALL.parse(s, 0)
        if end is NEED:
            return False
        if end != FAIL:
            self._call(s.calls[0])
            self._buf = buf[end:]
            self._lstrip = True
        else:  # not a call: the marker is content
            self._content(TOOL_CALL)
            self._buf = buf[len(TOOL_CALL) :]
        self._mode = "content"
        return True


# --- prompt side ---


def fold_tool_responses(messages: list[dict]) -> list[dict]:
    """llama.cpp's ``convert_tool_responses_gemma4`` for the older template: an assistant message with
    calls, the ``tool`` messages after it and a final assistant answer become one assistant message with
    ``tool_calls``, ``tool_responses`` (``{"name", "response"}``, JSON content parsed) and ``content``."""
    out: list[dict] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls = list(m["tool_calls"])
        responses = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            t = messages[i]
            body = t.get("content")
            if isinstance(body, str):
                try:
                    body = json.loads(body)
                except ValueError:
                    pass
            k = len(responses)
            name = ((calls[k].get("function") or {}).get("name") if k < len(calls) else None) or ""
            responses.append({"name": name or t.get("tool_call_id") or "", "response": body})
            i += 1
        folded: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if responses:
            folded["tool_responses"] = responses
        content = m.get("content") or None
        if i < len(messages) and messages[i].get("role") == "assistant":
            nxt = messages[i]
            if not nxt.get("tool_calls") and nxt.get("content"):
                content = nxt["content"]
                i += 1
        folded["content"] = content if content is not None else ""
        if isinstance(m.get("reasoning_content"), str):
            folded["reasoning_content"] = m["reasoning_content"]
        out.append(folded)
    return out


# --- grammar ---

_INT = r"/-?(0|[1-9][0-9]*)/"
_NUM = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"


class _Rules:
    """Lark rules for Gemma values typed by JSON schemas."""

    def __init__(self, req: GrammarRequest) -> None:
        self.req = req
        self.rules: list[str] = []
        self.have: set[str] = set()
        self.count = 0
        self.q = req.lit(QUOTE)

    def add(self, name: str, body: str) -> str:
        if name not in self.have:
            self.have.add(name)
            self.rules.append(f"{name}: {body}")
        return name

    def new(self, body: str) -> str:
        self.count += 1
        return self.add(f"v{self.count}", body)

    def string(self) -> str:
        if "gstr" not in self.have:
            body, extra = self.req.until("gstr_body", QUOTE)
            self.add("gstr", f"{self.q} {body}")
            self.rules.extend(extra)
        return "gstr"

    def generic(self) -> str:
        if "gval" not in self.have:
            self.add("gval", f'{self.string()} | gdict | garr | {_NUM} | "true" | "false" | "null"')
            self.add("gdict", '"{" (gkv ("," gkv)*)? "}"')
            self.add("gkv", r'/[^:{}\[\],<]+/ ":" gval')
            self.add("garr", '"[" (gval ("," gval)*)? "]"')
        return "gval"

    def literal(self, v: Any) -> str:
        if isinstance(v, str):
            return f"{self.q} {lark_str(v)} {self.q}"
        if v is True or v is False or v is None:
            return lark_str(json.dumps(v))
        if isinstance(v, int | float):
            return lark_str(json.dumps(v))
        return self.generic()

    def value(self, schema: Any, depth: int = 0) -> str:
        if not isinstance(schema, dict) or depth > 16:
            return self.generic()
        if "const" in schema:
            return self.literal(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.new(" | ".join(f"({self.literal(v)})" for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.new(" | ".join(self.value(s, depth + 1) for s in schema[key]))
        t = schema.get("type")
        if isinstance(t, list) and t:
            return self.new(" | ".join(self.value({**schema, "type": x}, depth + 1) for x in t))
        if t == "string":
            return self.string()
        if t == "integer":
            return self.add("gint", _INT)
        if t == "number":
            return self.add("gnum", _NUM)
        if t == "boolean":
            return self.add("gbool", '"true" | "false"')
        if t == "null":
            return lark_str("null")
        if t == "array":
            item = self.value(schema.get("items"), depth + 1)
            return self.new(f'"[" ({item} ("," {item})*)? "]"')
        if t == "object" or (t is None and isinstance(schema.get("properties"), dict)):
            return self.dict(schema, depth)
        return self.generic()

    def dict(self, schema: dict, depth: int) -> str:
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return lark_str("{}") if schema.get("additionalProperties") is False else self.generic_dict()
        kvs = [f"{lark_str(k + ':')} {self.value(s, depth + 1)}" for k, s in props.items()]
        kv = self.new(" | ".join(f"({x})" for x in kvs))
        return self.new(f'"{{" ({kv} ("," {kv})*)? "}}"')

    def generic_dict(self) -> str:
        self.generic()
        return "gdict"


class Call(Node):
    """One call, ``<|tool_call>call:NAME{key:value,...}<tool_call|>``: the parser reads any name and any
    Gemma value (:func:`read_gemma_value`, the arguments as JSON text), the closing tag after optional
    whitespace (which the end of generation may cut off); the grammar writes one of the request's
    functions, its arguments typed by its schema (:class:`_Rules`)."""

    def parse(self, s: Scan, i: int) -> int | None:
        buf, final = s.buf, s.final
        i += len(TOOL_CALL)
        m = _NAME.match(buf, i)
        if m is None:
            return NEED if not final and _NAME_PREFIX.fullmatch(buf, i) else FAIL
        got = read_gemma_value(buf, m.end())
        if got is PARTIAL_VALUE:
            return FAIL if final else NEED
        if got is None:
            return FAIL
        args, end = got  # type: ignore[misc]
        end = expect_tag(buf, end, TOOL_CALL_END, final)
        if end is None:
            return NEED
        if end < 0:
            return FAIL
        s.calls.append(ToolCall(m.group(1), args))
        return end

    def lark(self, g: Lark) -> str:
        req, r = g.req, _Rules(g.req)
        alts = []
        for k, f in enumerate(req.functions):
            args = r.dict(f["parameters"], 0) if isinstance(f["parameters"], dict) else r.generic_dict()
            alts.append(r.add(f"f{k}", f"{lark_str(f['name'])} {args}"))
        g.rules.extend(r.rules)
        return f'{req.lit(TOOL_CALL)} "call:" ({" | ".join(alts)}) {req.lit(TOOL_CALL_END)}'

    def start(self) -> tuple[str, bool]:
        return regex.escape(TOOL_CALL), False


CALL = Call()


def build_gemma4_grammar(req: GrammarRequest, think: ThinkTags | None) -> ToolGrammar:
    """The tool-call grammar of Gemma 4 (``think``: the reasoning block a required grammar may start with)."""
    g = Lark(req)
    call = CALL.lark(g)
    prefix, extra = reasoning_prefix(req, think)
    rules = [f"start: {prefix} {req.calls('call')}", f"call: {call}", *g.rules, *extra]
    return ToolGrammar(assemble(rules), call_triggers_gemma4(req), Gemma4Format.preserved)


def call_triggers_gemma4(req: GrammarRequest) -> tuple[tuple[str, str], ...]:
    """``<|tool_call>`` outside any (closed) thought block, wherever the blocks are; none when required."""
    if req.required:
        return ()
    s, e, c = (regex.escape(x) for x in (CHANNEL, CHANNEL_END, TOOL_CALL))
    block = rf"{s}(?:(?!{e})[\s\S])*{e}"
    head = rf"(?:(?!{e})[\s\S])*{e}" if req.thinking_forced_open else ""
    return (("pattern_full", rf"^{head}(?:{block}|(?!{s}|{c})[\s\S])*?({c})[\s\S]*$"),)


class Gemma4Format(ChatFormat):
    """Templates that write ``'<|tool_call>call:'`` (Gemma 4)."""

    name = "gemma4"
    supports_tools = True
    think = GEMMA4_THINK
    object_arguments = True
    preserved = (CHANNEL, CHANNEL_END, TOOL_CALL, TOOL_CALL_END, TURN, QUOTE)

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        if _NEW_TEMPLATE not in self.source:
            out = fold_tool_responses(out)
        return out

    def finish_prompt(self, prompt: str, add_generation_prompt: bool) -> str:
        """As llama.cpp: a prompt that ends a turn (content after tool results) gets the model's turn."""
        if add_generation_prompt and prompt.endswith("<turn|>\n"):
            return prompt + _MODEL_TURN
        return prompt

    def thinking_forced_open(self, prompt_text: str) -> bool:
        i = prompt_text.rfind(CHANNEL + THOUGHT)
        return i >= 0 and not prompt_text[i + len(CHANNEL + THOUGHT) :].strip()

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        return build_gemma4_grammar(req, self.think)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return Gemma4Parser(syntax)
