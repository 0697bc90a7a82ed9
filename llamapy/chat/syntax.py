"""Tool-call syntax as combinators: a family states its call syntax once, and both its Lark grammar and
its streaming parser are built from that statement (llama.cpp's ``common/chat-peg-parser``, in small).

A syntax is a tree of :class:`Node`\\ s. Each node can

- ``parse(s, i)``: read the model's text ``s.buf`` from ``i``: the index after it, ``NEED`` (the text
  so far may still become this; more is needed) or ``FAIL``; what it reads (the function's name, its
  arguments) goes into the :class:`Scan` ``s``;
- ``lark(g)``: the Lark element that generates it (rules it needs go into the :class:`Lark` builder
  ``g``); None for a node that is only accepted, never generated (:func:`accept`);
- ``start()``: a ``regex`` for its first text (the parser's call marker), and ``trigger()``: the literal
  text a lazy grammar starts at (``triggers(req)``: all of them, of the alternatives ``generates(req)``:
  the ones the request's grammar writes).

The parser is deliberately more lenient than the grammar (any whitespace where the grammar writes one
newline, variants small models write): ``ws(grammar)`` and ``accept`` say where.

:func:`tool_syntax` wraps one call's syntax into a family's grammar (an optional reasoning block, then one
or more calls, ``TAIL``, end of generation) and parser (:class:`SyntaxParser`); :class:`SyntaxFormat`
makes it a format's ``build_grammar`` and ``parser``. A piece peculiar to one family is a ``Node`` of its
own in the family's file, its parse and its grammar side by side.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import field
from typing import Any

import regex

from .._dataclass import dataclass
from .common import (
    NOT_A_CALL,
    PARTIAL,
    WS,
    CallParse,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolCall,
    ToolGrammar,
    assemble,
    call_from_object,
    call_trigger,
    call_triggers,
    is_string_schema,
    json_rule,
    lark_str,
    one_of,
    parameter_schemas,
    parameter_tables,
    read_json,
    reasoning_prefix,
    regex_escape,
    skip_ws,
)
from .reasoning import ThinkTags

NEED: None = None  # parse: the text so far is a prefix; more is needed
FAIL = -1  # parse: not this


@dataclass
class Scan:
    """One parse of a call: the text, whether it is all there, and what was read."""

    buf: str
    final: bool
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # function -> {parameter: schema}
    name: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    calls: list[ToolCall] = field(default_factory=list)
    json_cache: dict = field(default_factory=dict)  # read_json's, kept while the text only grows
    content: str = ""  # content the syntax itself holds (the generic JSON answer's ``response``)
    match: Any = None  # what a family's own node keeps of its text (gpt-oss: a message header's match)

    def schema(self, key: str) -> Any:
        return self.tables.get(self.name, {}).get(key)


@dataclass
class Lark:
    """Grammar being built: the request, extra rules, and the function whose body is being written."""

    req: GrammarRequest
    rules: list[str] = field(default_factory=list)
    function: dict | None = None
    k: int = 0  # the function's index
    tokens: tuple[str, ...] = ()  # special tokens inside literal texts (DeepSeek's ``｜DSML｜``)

    def text(self, text: str) -> str:
        """Literal ``text`` as Lark, each of ``tokens`` in it as the token where the vocabulary has it."""
        parts = [text]
        for tok in self.tokens:
            parts = [
                q for p in parts for q in (regex.split(f"({regex.escape(tok)})", p) if p != tok else [p])
            ]
        return " ".join(self.req.lit(p) if p in self.tokens else lark_str(p) for p in parts if p)

    def until(self, name: str, end: str) -> str:
        """Free text up to and including ``end``; when ``end`` starts with one of ``tokens`` that the
        vocabulary has as a special token, the text stops at that token (and the rest of ``end`` follows)."""
        if any(end.startswith(t) and self.req.special(t) for t in self.tokens):
            return f"/(?s:.*)/ {self.text(end)}"
        body, rules = self.req.until(name, end)
        self.rules.extend(r for r in rules if r not in self.rules)
        return body

    def rule(self, name: str, body: str) -> str:
        """Add ``name: body`` once; returns ``name`` (without its ``[lazy]`` mark)."""
        text = f"{name}: {body}"
        if text not in self.rules:
            self.rules.append(text)
        return name.split("[")[0]


class Node:
    """One piece of syntax."""

    def parse(self, s: Scan, i: int) -> int | None:
        raise NotImplementedError

    def lark(self, g: Lark) -> str | None:
        raise NotImplementedError

    def start(self) -> tuple[str, bool]:
        """A regex for this node's first text, and whether it is the whole node (a later node's start
        may follow)."""
        raise NotImplementedError

    def trigger(self) -> str:
        """The literal text a generated call starts with."""
        return ""

    def generates(self, req: GrammarRequest) -> bool:
        """Whether the grammar for ``req`` writes this node (an accepted variant, a function syntax no
        allowed function has: not)."""
        return True

    def triggers(self, req: GrammarRequest) -> list[str]:
        """The literal texts a call the grammar for ``req`` writes may start with."""
        t = self.trigger()
        return [t] if t and self.generates(req) else []

    def __or__(self, other: Node) -> Alt:
        return Alt((self, other))


def match_text(s: Scan, i: int, text: str) -> int | None:
    """``text`` at ``i``: the index after it, ``NEED`` or ``FAIL``."""
    if s.buf.startswith(text, i):
        return i + len(text)
    if not s.final and text.startswith(s.buf[i:]):
        return NEED
    return FAIL


@dataclass
class Lit(Node):
    """Literal text; ``special``: the grammar uses the special token where the vocabulary has one."""

    text: str
    special: bool = False

    def parse(self, s: Scan, i: int) -> int | None:
        return match_text(s, i, self.text)

    def lark(self, g: Lark) -> str:
        return g.req.lit(self.text) if self.special else g.text(self.text)

    def start(self) -> tuple[str, bool]:
        return regex.escape(self.text), True

    def trigger(self) -> str:
        return self.text


@dataclass
class EndTag(Lit):
    """A closing tag, after optional whitespace, that the end of generation may cut off: at the end, a
    missing tag with nothing else left is accepted."""

    sep: str = WS  # the whitespace the grammar writes before it

    def parse(self, s: Scan, i: int) -> int | None:
        j = skip_ws(s.buf, i)
        if s.final and j == len(s.buf):
            return j
        return match_text(s, j, self.text)

    def lark(self, g: Lark) -> str:
        return f"{self.sep} {super().lark(g)}".strip()


@dataclass
class Ws(Node):
    """Whitespace: any amount when parsing; the grammar writes ``grammar`` (bounded ``WS`` by default)."""

    grammar: str = WS
    more: bool = False  # at the end of unfinished text, wait for what follows the whitespace

    def parse(self, s: Scan, i: int) -> int | None:
        j = skip_ws(s.buf, i)
        return NEED if self.more and j == len(s.buf) and not s.final else j

    def lark(self, g: Lark) -> str:
        return self.grammar

    def start(self) -> tuple[str, bool]:
        return r"\s*", True


@dataclass
class Seq(Node):
    nodes: tuple[Node, ...]

    def parse(self, s: Scan, i: int) -> int | None:
        for node in self.nodes:
            got = node.parse(s, i)
            if got is NEED or got == FAIL:
                return got
            i = got
        return i

    def lark(self, g: Lark) -> str | None:
        if not self.generates(g.req):
            return None
        return " ".join(x for x in (n.lark(g) for n in self.nodes) if x)

    def start(self) -> tuple[str, bool]:
        out = ""
        for node in self.nodes:
            pattern, whole = node.start()
            out += pattern
            if not whole:
                return out, False
        return out, True

    def trigger(self) -> str:
        return self.nodes[0].trigger()

    def generates(self, req: GrammarRequest) -> bool:
        return all(n.generates(req) for n in self.nodes)

    def triggers(self, req: GrammarRequest) -> list[str]:
        return self.nodes[0].triggers(req) if self.generates(req) else []


@dataclass
class Alt(Node):
    """The first alternative that does not fail (PEG order); one that needs more text waits."""

    nodes: tuple[Node, ...]

    def parse(self, s: Scan, i: int) -> int | None:
        n = len(s.calls)
        for node in self.nodes:
            got = node.parse(s, i)
            if got != FAIL:
                return got
            del s.calls[n:]
        return FAIL

    def lark(self, g: Lark) -> str | None:
        alts = [x for x in (n.lark(g) for n in self.nodes) if x]
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else f"({' | '.join(alts)})"

    def start(self) -> tuple[str, bool]:
        return f"(?:{'|'.join(n.start()[0] for n in self.nodes)})", False

    def trigger(self) -> str:
        return next((t for t in (n.trigger() for n in self.nodes) if t), "")

    def generates(self, req: GrammarRequest) -> bool:
        return any(n.generates(req) for n in self.nodes)

    def triggers(self, req: GrammarRequest) -> list[str]:
        return list(dict.fromkeys(t for n in self.nodes for t in n.triggers(req)))


@dataclass
class Accept(Node):
    """Parsed, never generated: a variant the model may write but the grammar does not offer."""

    node: Node

    def parse(self, s: Scan, i: int) -> int | None:
        return self.node.parse(s, i)

    def lark(self, g: Lark) -> None:
        return None

    def start(self) -> tuple[str, bool]:
        return self.node.start()

    def generates(self, req: GrammarRequest) -> bool:
        return False


class Drop(Accept):
    """A wrapper of the answer's text (``<|START_RESPONSE|>``...) that the parser drops, with or without
    tools: the only part of a syntax read when the request has none (:func:`drop`)."""


def content_drops(node: Node) -> list[Node]:
    """The :class:`Drop` alternatives of a call syntax (through nested alternatives)."""
    if isinstance(node, Drop):
        return [node]
    if isinstance(node, Alt):
        return [d for n in node.nodes for d in content_drops(n)]
    return []


@dataclass
class Function(Node):
    """A call's head ``template`` (with ``{name}``) and its body: the grammar has one alternative per
    allowed function (rule ``f{k}``), the body written for that function's parameters; the parser reads
    the name (``name_pattern``) and the body, which records the arguments."""

    template: str
    body: Node
    name_pattern: str = r"[^>\n]+"
    pattern: str | None = None  # the head as the parser reads it (group ``name_group``: the name)
    known: bool = False  # the name must be one of the request's tools (when it has any)
    name_group: int = 1
    call_id: Callable[[Any], str] | None = None  # the call's id from the head's match (default: none)
    head: Callable[[Lark, str], str] | None = None  # the head in the grammar, from (grammar, function name)
    only: Callable[[dict], bool] | None = None  # the functions written in this syntax (default: all)

    def __post_init__(self) -> None:
        before, _, after = self.template.partition("{name}")
        self._before = before
        head = regex.escape(before) + f"({self.name_pattern})" + regex.escape(after)
        self._head = regex.compile(self.pattern or head)

    def parse(self, s: Scan, i: int) -> int | None:
        m = self._head.match(s.buf, i, partial=not s.final)
        if m is None:
            return FAIL
        if m.partial or (m.end() == len(s.buf) and not s.final):  # (a bare name may go on)
            return NEED
        s.name, s.args = m.group(self.name_group).strip(), {}
        if self.known and s.tables and s.name not in s.tables:
            return FAIL
        end = self.body.parse(s, m.end())
        if end is not NEED and end != FAIL:
            call_id = self.call_id(m) if self.call_id else ""
            s.calls.append(ToolCall(s.name, json.dumps(s.args, ensure_ascii=False), call_id))
        return end

    def _functions(self, req: GrammarRequest) -> list[tuple[int, dict]]:
        return [(k, f) for k, f in enumerate(req.functions) if self.only is None or self.only(f)]

    def lark(self, g: Lark) -> str | None:
        alts = []
        for k, f in self._functions(g.req):
            g.function, g.k = f, k
            head = (
                self.head(g, f["name"]) if self.head else g.text(self.template.replace("{name}", f["name"]))
            )
            g.rule(f"f{k}", f"{head} {self.body.lark(g)}".strip())
            alts.append(f"f{k}")
        g.function = None
        return f"({' | '.join(alts)})" if alts else None

    def start(self) -> tuple[str, bool]:
        return (self.pattern or regex.escape(self._before)), False

    def trigger(self) -> str:
        return self._before

    def generates(self, req: GrammarRequest) -> bool:
        return bool(self._functions(req))


@dataclass
class Code(Node):
    """Raw code up to ``until`` (without it: to the end of the generation, only known there), not where
    ``guard`` matches (JSON instead): the arguments ``{"code": ...}`` of the function being read, when it
    is one of ``names``, or (``call``) a call of ``python`` of its own. The grammar writes ``gen`` (a Lark
    element; None: never) for a function of ``names`` (``call``: where the request has one)."""

    until: str | None = None
    guard: str | None = None
    call: bool = False
    gen: str | None = None
    names: tuple[str, ...] = ("python",)

    def __post_init__(self) -> None:
        self._guard = regex.compile(self.guard) if self.guard else None

    def parse(self, s: Scan, i: int) -> int | None:
        if (self._guard and self._guard.match(s.buf, i)) or (not self.call and s.name not in self.names):
            return FAIL
        end = s.buf.find(self.until, i) if self.until else -1
        if end < 0:
            if not s.final:
                return NEED
            end = len(s.buf)
        code = {"code": s.buf[i:end]}
        if self.call:
            s.calls.append(ToolCall("python", json.dumps(code, ensure_ascii=False)))
        else:
            s.args = code
        return end

    def lark(self, g: Lark) -> str | None:
        if g.function is not None:
            return self.gen if g.function["name"] in self.names else None
        return self.gen if self.generates(g.req) else None

    def generates(self, req: GrammarRequest) -> bool:
        return self.gen is not None and any(f["name"] in self.names for f in req.functions)

    def start(self) -> tuple[str, bool]:
        return "", False


# --- parameter values ---


def convert_value(raw: str, schema: Any) -> Any:
    """A parameter's text as a JSON value: kept a string when the schema says string (or the text is
    not JSON), else parsed (as llama.cpp's XML-style formats)."""
    if is_string_schema(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


@dataclass
class Text:
    """A parameter value written as text up to the parameter's closing tag ``close``. ``newlines``: one
    newline after the opening tag and one before the closing tag are not part of it (the grammar writes
    them around JSON values). ``special``: the grammar may end a string at ``close`` as a special token."""

    newlines: bool = False
    special: bool = True
    special_close: bool = False  # the grammar writes ``close`` after a JSON value as a special token

    def read(self, s: Scan, v: int, close: str) -> tuple[str, int] | int | None:
        """``(raw text, index after close)``, ``NEED`` or ``FAIL``."""
        e = s.buf.find(close, v)
        if e < 0:
            return FAIL if s.final else NEED
        raw = s.buf[v:e]
        if self.newlines:
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
        return raw, e + len(close)

    def lark_string(self, g: Lark, close: str) -> str:
        """A string value with its closing tag."""
        if self.special:
            body, rules = g.req.until("str_value", close)
            g.rules.extend(r for r in rules if r not in g.rules)
            return body
        return g.rule("str_value[lazy]", rf"/(?s:.*){regex_escape(close)}/")

    def lark_json(self, g: Lark, rule: str, close: str) -> str:
        """A JSON value (rule ``rule``) with its closing tag."""
        if self.newlines:
            return f'"\\n" {rule} {lark_str(chr(10) + close)}'
        return f"{rule} {g.req.lit(close) if self.special_close else g.text(close)}"


@dataclass
class Cdata(Text):
    """Text that may be wrapped in ``<![CDATA[...]]>`` (for ``<``, ``&`` or newlines in it)."""

    OPEN, CLOSE = "<![CDATA[", "]]>"

    def read(self, s: Scan, v: int, close: str) -> tuple[str, int] | int | None:
        buf = s.buf
        if buf.startswith(self.OPEN, v):
            e = buf.find(self.CLOSE, v)
            if e < 0:
                return FAIL if s.final else NEED
            after = match_text(s, e + len(self.CLOSE), close)
            if after is NEED or after == FAIL:
                return after
            return buf[v + len(self.OPEN) : e], after
        if not s.final and self.OPEN.startswith(buf[v:]) and len(buf) - v < len(self.OPEN):
            return NEED
        return super().read(s, v, close)

    def lark_string(self, g: Lark, close: str) -> str:
        g.rule("cdata_body[lazy]", rf"/(?s:.*){regex_escape(self.CLOSE)}/")
        g.rule("plain_body[lazy]", rf"/(?s:.*){regex_escape(close)}/")
        return g.rule("str_value", f"({lark_str(self.OPEN)} cdata_body {lark_str(close)}) | plain_body")


@dataclass
class TaggedParams(Node):
    """Parameters written as tags, then ``end``: ``open`` (with ``{key}``) value ``close`` for each, in any
    order (``declared``: in the schema's order, required ones required, each followed by ``sep``), with
    whitespace between. A value is text (``value``), converted by the parameter's schema
    (:func:`convert_value`); the grammar writes a string parameter as text, another as JSON of its
    schema."""

    open: str
    close: str
    end: Node
    value: Text = field(default_factory=Text)
    declared: bool = False
    sep: str = WS
    key_pattern: str = r"[^>\n]+"
    pattern: str | None = None  # the opening tag as the parser reads it (group 1: the key)
    # the opening tag in the grammar, from (grammar, key, whether the value is a string)
    open_lark: Callable[[Lark, str, bool], str] | None = None
    # a value from (the opening tag's match, its text, the parameter's schema); default convert_value
    convert: Callable[[Any, str, Any], Any] | None = None

    def __post_init__(self) -> None:
        before, _, after = self.open.partition("{key}")
        head = regex.escape(before) + f"({self.key_pattern})" + regex.escape(after)
        self._open = regex.compile(self.pattern or head)

    def parse(self, s: Scan, i: int) -> int | None:
        buf, final = s.buf, s.final
        while True:
            j = skip_ws(buf, i)
            done = self.end.parse(s, j)
            if done is not NEED and done != FAIL:
                return done
            p = self._open.match(buf, j, partial=not final)
            if p is None or p.partial:
                return NEED if not final and (p is not None or done is NEED) else FAIL
            got = self.value.read(s, p.end(), self.close)
            if got is NEED or got == FAIL:
                return got
            key = p.group(1).strip()
            convert = self.convert or (lambda _, raw, schema: convert_value(raw, schema))
            s.args[key] = convert(p, got[0], s.schema(key))
            i = got[1]

    def lark(self, g: Lark) -> str:
        assert g.function is not None
        params = g.function["parameters"]
        required = set(params.get("required") or ())
        items = []
        for j, (key, schema) in enumerate(parameter_schemas(params)):
            if is_string_schema(schema):
                value = self.value.lark_string(g, self.close)
            else:
                value = self.value.lark_json(g, g.rule(f"f{g.k}_v{j}", json_rule(schema)), self.close)
            is_string = is_string_schema(schema)
            head = (
                self.open_lark(g, key, is_string)
                if self.open_lark
                else g.text(self.open.replace("{key}", key))
            )
            item = f"{head} {value}"
            if self.declared:
                item = f"{item} {self.sep}"
                items.append(item if key in required else f"({item})?")
            else:
                items.append(item)
        end = self.end.lark(g)
        if self.declared:
            return " ".join([*items, end])
        body = f"((({') | ('.join(items)})) {self.sep})*" if items else ""
        return f"{body} {end}".strip()

    def start(self) -> tuple[str, bool]:
        return "", False


@dataclass
class Repeat(Node):
    """One or more ``node`` (several in the grammar only when parallel calls are allowed), whitespace
    between, then ``end``, which is only looked for after the first."""

    node: Node
    end: Node
    sep: str = WS  # the whitespace the grammar writes between two
    once: bool = False  # the grammar writes ``node`` once (it holds all the calls itself)

    def parse(self, s: Scan, i: int) -> int | None:
        n = len(s.calls)
        while True:
            j = skip_ws(s.buf, i)
            done = self.end.parse(s, j)
            if done is not NEED and done != FAIL:
                return done if len(s.calls) > n else FAIL
            got = self.node.parse(s, j)
            if got == FAIL:
                return NEED if done is NEED else FAIL
            if got is NEED:
                return NEED
            i = got

    def lark(self, g: Lark) -> str:
        node, end = self.node.lark(g), self.end.lark(g)
        many = not self.once and g.req.parallel
        return f"{node} ({self.sep} {node})* {end}" if many else f"{node} {end}"

    def start(self) -> tuple[str, bool]:
        return self.node.start()[0], False

    def trigger(self) -> str:
        return self.node.trigger()


def call_schemas(functions: list[dict]) -> list[dict]:
    """The schema of a call ``{"name": ..., "arguments": {...}}`` of each function."""
    return [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]


@dataclass
class JsonCalls(Node):
    """Calls as JSON: the parser reads one object ``{"name", "arguments"}`` (or ``"parameters"``, or
    OpenAI's ``{"function": ...}``) or an array of them, and a comma after it (``one``: exactly one
    object, no comma); the grammar writes one object of an allowed function's schema (``array``: an array
    of one, or more when parallel calls are allowed). ``first``: a regex for its start (the call marker);
    ``only_array``: an object alone is not a call; ``comma``: take a comma after the value; ``keys``: where
    the arguments may be."""

    array: bool = False
    one: bool = False
    first: str = r"[\[{]"
    only_array: bool = False
    comma: bool = True
    keys: tuple[str, ...] = ("arguments", "parameters")
    item: Callable[[dict], dict] | None = None  # a function's call schema (default: call_schemas')
    read: Callable[[Any], ToolCall | None] | None = None  # a call from one JSON item

    def parse(self, s: Scan, i: int) -> int | None:
        got = read_json(s.buf, i, s.json_cache)
        if got is PARTIAL:
            return FAIL if s.final else NEED
        if got is None:
            return FAIL
        value, i = got  # type: ignore[misc]
        if self.only_array and not isinstance(value, list):
            return FAIL
        items = [value] if self.one or not isinstance(value, list) else value
        read = self.read or (lambda v: call_from_object(v, args_keys=self.keys))
        found = [read(v) for v in items]
        if not found or any(c is None for c in found):
            return FAIL
        s.calls.extend(found)  # type: ignore[arg-type]
        if self.one or not self.comma:
            return i
        j = skip_ws(s.buf, i)
        return j + 1 if j < len(s.buf) and s.buf[j] == "," else i  # (objects separated by commas)

    def lark(self, g: Lark) -> str:
        schema = one_of(
            [self.item(f) for f in g.req.functions] if self.item else call_schemas(g.req.functions)
        )
        if not self.array:
            return g.rule("call_json", json_rule(schema))
        array = {"type": "array", "items": schema, "minItems": 1}
        if not g.req.parallel:
            array["maxItems"] = 1
        return g.rule("calls_json", json_rule(array))

    def start(self) -> tuple[str, bool]:
        return self.first, False


@dataclass
class JsonArgs(Node):
    """A call's arguments as one JSON object; the grammar writes JSON of the function's parameters."""

    def parse(self, s: Scan, i: int) -> int | None:
        j = skip_ws(s.buf, i)
        if j < len(s.buf) and s.buf[j] != "{":  # (not an object: known at once)
            return FAIL
        got = read_json(s.buf, i, s.json_cache)
        if got is PARTIAL:
            return FAIL if s.final else NEED
        if got is None or not isinstance(got[0], dict):  # type: ignore[index]
            return FAIL
        s.args, end = got  # type: ignore[misc]
        return end

    def lark(self, g: Lark) -> str:
        assert g.function is not None
        return g.rule(f"f{g.k}_args", json_rule(g.function["parameters"]))

    def start(self) -> tuple[str, bool]:
        return r"\s*\{", False


@dataclass
class Pattern(Node):
    """Text matching a ``regex`` pattern; the grammar writes ``gen`` (nothing: a variant it never writes)."""

    pattern: str
    gen: Node | None = None

    def __post_init__(self) -> None:
        self._re = regex.compile(self.pattern)

    def parse(self, s: Scan, i: int) -> int | None:
        m = self._re.match(s.buf, i, partial=not s.final)
        if m is None:
            return FAIL
        return NEED if m.partial else m.end()

    def lark(self, g: Lark) -> str | None:
        return self.gen.lark(g) if self.gen else None

    def trigger(self) -> str:
        return self.gen.trigger() if self.gen else ""

    def start(self) -> tuple[str, bool]:
        return f"(?:{self.pattern})", True


# --- constructors ---


def lit(text: str, special: bool = False) -> Lit:
    """Literal text (a special token in the grammar where ``special`` and the vocabulary has it)."""
    return Lit(text, special)


def end_tag(text: str, special: bool = False, sep: str = WS) -> EndTag:
    """A closing tag after whitespace (``sep`` in the grammar), which the end of generation may cut off."""
    return EndTag(text, special, sep)


def ws(grammar: str = WS, more: bool = False) -> Ws:
    """Any whitespace when parsing (``more``: at the end of unfinished text, wait for what follows);
    ``grammar`` (bounded by default) when generating."""
    return Ws(grammar, more)


def seq(*nodes: Node) -> Seq:
    return Seq(nodes)


def alt(*nodes: Node) -> Alt:
    return Alt(nodes)


def accept(node: Node) -> Accept:
    """A variant the parser reads and the grammar never writes."""
    return Accept(node)


def drop(node: Node) -> Drop:
    """``node`` as a :class:`Drop`: an answer wrapper read (and dropped) with or without tools."""
    return Drop(node)


def function(
    template: str,
    *body: Node,
    name_pattern: str = r"[^>\n]+",
    pattern: str | None = None,
    known: bool = False,
    **kw: Any,
) -> Function:
    """One call of a function named in ``template`` (``"<function={name}>"``), then ``body``;
    ``pattern``: the head as the parser reads it, where it is more lenient than ``template``; ``known``:
    the name must be one of the request's tools; ``name_group``, ``call_id``, ``head``, ``only``: see
    :class:`Function`."""
    return Function(template, body[0] if len(body) == 1 else Seq(body), name_pattern, pattern, known, **kw)


def repeat(node: Node, end: Node, sep: str = WS, once: bool = False) -> Repeat:
    """One or more ``node`` then ``end`` (calls in one block); see :class:`Repeat`."""
    return Repeat(node, end, sep, once)


def json_calls(array: bool = False, one: bool = False, first: str = r"[\[{]", **kw: Any) -> JsonCalls:
    """Calls as JSON ``{"name", "arguments"}`` objects; see :class:`JsonCalls`."""
    return JsonCalls(array, one, first, **kw)


def code(until: str | None = None, **kw: Any) -> Code:
    """Raw code up to ``until`` (or the end): ``python``'s ``{"code": ...}``; see :class:`Code`."""
    return Code(until, **kw)


def json_args() -> JsonArgs:
    """A call's arguments as a JSON object of the function's parameters."""
    return JsonArgs()


def pattern(text: str, gen: Node | None = None) -> Pattern:
    """Text matching the regex ``text``; the grammar writes ``gen`` (None: parse only)."""
    return Pattern(text, gen)


def tagged_params(open: str, close: str, end: Node, **kw: Any) -> TaggedParams:
    """Tagged parameters (see :class:`TaggedParams`) up to ``end``."""
    return TaggedParams(open, close, end, **kw)


# --- a family's syntax ---


@dataclass
class ToolSyntax:
    """A family's tool calls: ``call`` (one call's syntax), optionally in a reasoning block first, one or
    more calls (several when parallel calls are allowed, ``sep`` between).

    ``at_start``: calls also recognised only at the start of the answer (Llama 3's bare JSON): the
    parser's ``call_at_start``, a ``pattern_full`` trigger anchored at the start, an alternative of the
    grammar's call. ``section``: optional tags around all the calls (Kimi K2's): the grammar may write
    them, the parser drops them (with the whitespace after them) wherever they stand."""

    call: Node
    repeat: bool = True  # False: one call (a block that holds several: :func:`repeat`)
    tokens: tuple[str, ...] = ()  # special tokens inside literal texts, written as tokens by the grammar
    sep: str = WS  # between two calls, in the grammar
    lead: str = ""  # before the first call, in the grammar
    at_start: Node | None = None
    at_start_skip: str = ""  # a regex the parser skips before an ``at_start`` call (Llama 3's ``;``)
    section: tuple[str, str] | None = None
    # a lazy grammar's triggers, for calls that do not start with a text of their own (Functionary v3.2)
    start: Callable[[GrammarRequest], tuple[tuple[str, str], ...]] | None = None

    def __post_init__(self) -> None:
        drops = [accept(seq(lit(tag), ws(more=True))) for tag in self.section or ()]
        self.reads = Alt((self.call, *drops)) if drops else self.call  # what a call marker starts
        self.first: Node | None = None  # an at_start call, with what it skips
        if self.at_start is not None:
            self.first = (
                seq(Pattern(self.at_start_skip), self.at_start) if self.at_start_skip else self.at_start
            )
        self.reads_first = Alt((self.reads, self.first)) if self.first else self.reads
        drops = content_drops(self.call)
        self.reads_content: Node | None = Alt(tuple(drops)) if drops else None  # (without tools)

    def grammar(
        self, req: GrammarRequest, think: ThinkTags | None, preserved: tuple[str, ...]
    ) -> ToolGrammar:
        g = Lark(req, tokens=self.tokens)
        alts = [x for x in (n.lark(g) for n in (self.at_start, self.call) if n) if x]
        prefix, extra = reasoning_prefix(req, think)
        calls = f"call ({self.sep} call)*" if self.repeat and req.parallel else "call"
        if self.section:
            calls = f"({g.text(self.section[0])} {WS})? {calls} ({WS} {g.text(self.section[1])})?"
        start = " ".join(x for x in (prefix, self.lead, calls) if x)
        rules = [f"start: {start}", f"call: {' | '.join(alts)}", *g.rules, *extra]
        return ToolGrammar(assemble(rules), self.triggers(req, think), preserved)

    def triggers(self, req: GrammarRequest, think: ThinkTags | None) -> tuple[tuple[str, str], ...]:
        """A lazy grammar's triggers: where a call starts (outside a reasoning block)."""
        if req.required:
            return ()
        if self.start is not None:
            return self.start(req)
        out: tuple[tuple[str, str], ...] = ()
        if self.at_start is not None and self.at_start.generates(req):
            out += (("pattern_full", rf"^\s*({self.at_start.start()[0]})[\s\S]*"),)
        words = list(
            dict.fromkeys(
                [*self.section[:1], *self.call.triggers(req)] if self.section else self.call.triggers(req)
            )
        )
        if len(words) == 1:
            return out + call_triggers(req, think, words[0])
        if words:
            pattern = "|".join(regex.escape(w) for w in words)
            out += (call_trigger(pattern, think, req.thinking_forced_open),)
        return out

    def parser(
        self, syntax: ChatSyntax, think: ThinkTags | None, cls: type[SyntaxParser] | None = None
    ) -> SyntaxParser:
        return (cls or SyntaxParser)(syntax, self, think)


def tool_syntax(call: Node, repeat: bool = True, tokens: tuple[str, ...] = (), **kw: Any) -> ToolSyntax:
    """A family's calls: ``call`` (one or more, ``repeat``), optionally after a reasoning block;
    ``tokens``: special tokens that literal texts hold (the grammar writes them as the tokens);
    ``sep``, ``lead``, ``at_start``, ``section``: see :class:`ToolSyntax`."""
    return ToolSyntax(call, repeat, tokens, **kw)


class SyntaxParser(StreamParser):
    """The streaming parser of a :class:`ToolSyntax`: content and reasoning as :class:`StreamParser`, a
    call wherever the syntax's first text appears (and at the start, ``at_start``'s)."""

    def __init__(self, syntax: ChatSyntax, tool: ToolSyntax, think: ThinkTags | None) -> None:
        self.think = think
        # without tools only the answer's wrappers are read (and dropped)
        self.reads = tool.reads_first if syntax.parse_tool_calls else tool.reads_content
        if self.reads is not None:
            self.call_start = regex.compile(
                (tool.reads if syntax.parse_tool_calls else self.reads).start()[0]
            )
        if tool.first is not None and syntax.parse_tool_calls:
            self.call_at_start = regex.compile(tool.first.start()[0])
        super().__init__(syntax)
        self.tool = tool
        self.tables = parameter_tables(syntax.tools)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        if self.reads is None:
            return NOT_A_CALL
        s = Scan(buf, final, self.tables, json_cache=self.json_cache)
        end = self.reads.parse(s, 0)
        if end is NEED:
            return None
        if end == FAIL:
            return NOT_A_CALL
        return CallParse(s.calls, end)


class SyntaxFormat:
    """For a :class:`ChatFormat` (``class F(SyntaxFormat, ChatFormat)``) whose calls are one
    :class:`ToolSyntax`, ``tool``: a grammar may start with the reasoning block of :meth:`grammar_think`
    (the template's), the parser reads :meth:`parser_think`'s (the family's, whatever the template), with
    ``parser_class`` where the family's parser does more."""

    supports_tools = True
    tool: ToolSyntax
    parser_class: type[SyntaxParser] | None = None
    think: ThinkTags | None
    preserved: tuple[str, ...]

    def grammar_think(self) -> ThinkTags | None:
        """The reasoning block a grammar may start with (by default ``think``)."""
        return self.think

    def parser_think(self) -> ThinkTags | None:
        """The reasoning block the parser reads (by default the class's ``think``)."""
        return type(self).think

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        return self.tool.grammar(req, self.grammar_think(), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return self.tool.parser(syntax, self.parser_think(), self.parser_class)
