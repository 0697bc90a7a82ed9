"""Types shared by the chat formats, the streaming parser machinery, and JSON / grammar helpers.

A *format* (one subclass of :class:`ChatFormat` per model family) knows how its template wants the
conversation (``prepare_messages``), which grammar constrains a tool call (``grammar``), and how to
read the model's output back (``parser``). Parsers are incremental: ``feed`` takes detokenized text as
it is generated and returns :class:`ChatDelta` pieces; text that may be the start of a tag or a call is
held back until it is decided, so no delta ever has to be taken back. Concatenating all deltas gives
the :class:`ParsedMessage` that ``finish`` returns, whatever the split of the text into ``feed`` calls.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

import regex

from .._dataclass import dataclass
from .reasoning import THINK, StrippedText, ThinkTags, partial_suffix, prompt_opens_block

# --- data ---


@dataclass
class ToolCall:
    """One tool call: ``arguments`` is a JSON string (OpenAI's form)."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class ParsedMessage:
    """A whole assistant message as parsed from the model's output."""

    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ChatDelta:
    """One streamed piece: content, reasoning, or a piece of tool call ``tool_call_index``."""

    content: str = ""
    reasoning_content: str = ""
    tool_call_index: int | None = None
    tool_call_id: str | None = None
    tool_call_name: str | None = None
    tool_call_arguments: str = ""


@dataclass
class ToolGrammar:
    """A tool-call grammar (llguidance Lark). ``triggers`` make it lazy: it constrains the text from the
    trigger on, that is from a ``word``'s text or a ``token``, or from the first capture group of a
    ``pattern`` (searched anywhere) / ``pattern_full`` (matched against the whole output so far), the
    whole match when the pattern has no group. Empty ``triggers``: constrain from the first token."""

    lark: str
    triggers: tuple[tuple[str, str], ...] = ()
    preserved_tokens: tuple[str, ...] = ()

    def with_prefix(self, prefix: str, rules: Sequence[str]) -> ToolGrammar:
        """This grammar with ``prefix`` (Lark elements) before its start and ``rules`` added: what a
        ``required`` grammar may write before the calls (a reasoning block, a response)."""
        lark = self.lark.replace("start: ", f"start: {prefix} ", 1)
        return ToolGrammar(
            "\n".join([lark.rstrip("\n"), *rules]) + "\n", self.triggers, self.preserved_tokens
        )


@dataclass
class ChatSyntax:
    """What a request decided, handed to the parser. ``tools`` (the request's OpenAI tool list) is
    optional; formats whose arguments are not JSON use it to type parameter values."""

    format: str
    reasoning_format: str = "auto"
    thinking_forced_open: bool = False
    parse_tool_calls: bool = True
    tools: list[dict] | None = None


# --- JSON helpers ---

_STRING_BODY = regex.compile(r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_ESCAPE_START = regex.compile(r"\\(?:u[0-9a-fA-F]{0,3})?")
NUMBER = regex.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
NUMBER_PREFIX = regex.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_WS = " \t\n\r"


def skip_ws(text: str, i: int) -> int:
    """The first index at or after ``i`` that is not JSON whitespace."""
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def scan_json(text: str, pos: int = 0, cache: dict | None = None) -> tuple[str, int]:
    """Scan one JSON value starting at ``text[pos:]`` (after optional whitespace).

    Returns ``("complete", end)``, ``("partial", len(text))`` when the text is a valid prefix of a value,
    or ``("invalid", where)`` when no continuation can make it valid. ``cache`` (a dict kept while the
    text only grows at its end) lets a later call resume where a partial scan stopped."""
    n = len(text)
    resume = 0  # inside a string that started at i: where its scan stopped
    if cache is not None and pos in cache:
        stack, state, i, resume = cache[pos]
        stack = list(stack)
    else:
        stack, state, i = [], "value", skip_ws(text, pos)

    def partial(at: int, inside: int = 0) -> tuple[str, int]:
        if cache is not None:
            cache[pos] = (tuple(stack), state, at, inside)
        return "partial", n

    def string_end(i: int) -> int:  # the index after the string at i; -1: incomplete; -2: invalid
        nonlocal resume
        e = _STRING_BODY.match(text, max(i + 1, resume)).end()
        resume = 0
        if e < n and text[e] == '"':
            return e + 1
        if e == n or _ESCAPE_START.fullmatch(text, e):
            resume = e
            return -1
        return -2

    while True:
        if state == "after" and not stack:
            return "complete", i
        i = skip_ws(text, i)
        if i >= n:
            return partial(i)
        c = text[i]
        if c == '"' and state in ("value", "key_or_close", "key"):  # a string value or a key
            e = string_end(i)
            if e == -1:
                return partial(i, resume)
            if e == -2:
                return "invalid", i
            i, state = e, ("after" if state == "value" else "colon")
        elif state == "value":
            if c == "{":
                stack.append("}")
                i, state = i + 1, "key_or_close"
            elif c == "[":
                stack.append("]")
                i, state = i + 1, "value_or_close"
            elif c == "-" or c.isdigit():
                if NUMBER_PREFIX.fullmatch(text, i):  # the text ends inside a number
                    return partial(i)
                m = NUMBER.match(text, i)
                if m is None:
                    return "invalid", i
                i, state = m.end(), "after"
            else:
                for lit in ("true", "false", "null"):
                    if text.startswith(lit, i):
                        i, state = i + len(lit), "after"
                        break
                    if lit.startswith(text[i:]):
                        return partial(i)
                else:
                    return "invalid", i
        elif state == "value_or_close":
            if c == "]":
                stack.pop()
                i, state = i + 1, "after"
            else:
                state = "value"
        elif state in ("key_or_close", "key"):
            if c == "}" and state == "key_or_close":
                stack.pop()
                i, state = i + 1, "after"
            else:
                return "invalid", i
        elif state == "colon":
            if c != ":":
                return "invalid", i
            i, state = i + 1, "value"
        else:  # after a value inside a container
            if c == ",":
                i, state = i + 1, ("key" if stack[-1] == "}" else "value")
            elif c == stack[-1]:
                stack.pop()
                i += 1
            else:
                return "invalid", i


PARTIAL = object()  # read_json: the text is a valid prefix, more is needed


def read_json(text: str, pos: int = 0, cache: dict | None = None) -> tuple[Any, int] | object | None:
    """The JSON value at ``text[pos:]`` and the index after it; ``PARTIAL`` when the text stops inside
    a valid value; ``None`` when it is not JSON. ``cache``: see :func:`scan_json`."""
    status, end = scan_json(text, pos, cache)
    if status == "partial":
        return PARTIAL
    if status == "invalid":
        return None
    try:
        return json.loads(text[pos:end]), end
    except ValueError:
        return None


def dump_arguments(value: Any) -> str:
    """Arguments as OpenAI's JSON string: an object is dumped (``json.dumps(obj, ensure_ascii=False)``),
    a string holding a JSON object is normalized, another string is kept, nothing is ``{}``."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return json.dumps(parsed, ensure_ascii=False) if isinstance(parsed, dict) else value
    return json.dumps(value, ensure_ascii=False)


def call_from_object(
    obj: Any, name_key: str = "name", args_keys: Sequence[str] = ("arguments",)
) -> ToolCall | None:
    """A call from ``{"name": ..., "arguments": {...}}`` (also OpenAI's ``{"function": {...}}``) or None."""
    if not isinstance(obj, dict):
        return None
    if name_key == "name" and isinstance(obj.get("function"), dict) and "name" not in obj:
        inner = obj["function"]
        return call_from_object({**inner, "id": obj.get("id", inner.get("id"))}, name_key, args_keys)
    name = obj.get(name_key)
    if not isinstance(name, str) or not name:
        return None
    args = next((obj[k] for k in args_keys if k in obj), None)
    call_id = obj.get("id")
    return ToolCall(name, dump_arguments(args), call_id if isinstance(call_id, str) else "")


_ALNUM = string.ascii_letters + string.digits


def plain_calls(tool_calls: Sequence[dict], with_ids: bool = False) -> list[dict]:
    """OpenAI ``tool_calls`` of a history message as ``{"name", "arguments"[, "id"]}`` objects, the
    arguments parsed from their JSON string where they parse (templates that show calls as JSON)."""
    calls = []
    for c in tool_calls:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        call = {"name": fn.get("name"), "arguments": args}
        if with_ids:
            call["id"] = c.get("id")
        calls.append(call)
    return calls


def random_id(n: int = 24, prefix: str = "call_") -> str:
    """``prefix`` + ``n`` random letters and digits."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(n))


# --- parsers ---


class ChatParser:
    """Incremental parser of one generation. ``feed`` text in, deltas out; ``finish`` at the end."""

    def __init__(self, syntax: ChatSyntax) -> None:
        self.syntax = syntax
        self.new_id: Callable[[], str] = random_id
        self._msg = ParsedMessage()
        self._out: list[ChatDelta] = []
        self._finished = False
        self._buf = ""  # text not decided yet

    def feed(self, text: str) -> list[ChatDelta]:
        """Streamed text in (detokenized, preserved tokens as text); the deltas it decides."""
        if self._finished:
            raise RuntimeError("ChatParser.feed after finish")
        self._advance(text, final=False)
        return self._take()

    def finish(self) -> tuple[list[ChatDelta], ParsedMessage]:
        """End of generation: the last deltas and the whole message."""
        if not self._finished:
            self._advance("", final=True)
            self._finished = True
        msg = self._msg
        whole = ParsedMessage(
            msg.content,
            msg.reasoning_content,
            [ToolCall(c.name, c.arguments, c.id) for c in msg.tool_calls],
        )
        return self._take(), whole

    def _advance(self, text: str, final: bool) -> None:
        self._buf += text
        while self._step(final):
            pass

    def _step(self, final: bool) -> bool:
        """Decide what the start of ``_buf`` is; whether to step again."""
        raise NotImplementedError

    # --- emitting ---

    def _take(self) -> list[ChatDelta]:
        out, self._out = self._out, []
        return out

    def _content(self, text: str) -> None:
        if not text:
            return
        self._msg.content += text
        last = self._out[-1] if self._out else None
        if last is not None and last.content and last.tool_call_index is None:
            last.content += text
        else:
            self._out.append(ChatDelta(content=text))

    def _reasoning(self, text: str) -> None:
        if not text:
            return
        self._msg.reasoning_content = (self._msg.reasoning_content or "") + text
        last = self._out[-1] if self._out else None
        if last is not None and last.reasoning_content:
            last.reasoning_content += text
        else:
            self._out.append(ChatDelta(reasoning_content=text))

    def _call(self, call: ToolCall) -> None:
        if not call.id:
            call = ToolCall(call.name, call.arguments, self.new_id())
        index = len(self._msg.tool_calls)
        self._msg.tool_calls.append(call)
        self._out.append(
            ChatDelta(
                tool_call_index=index,
                tool_call_id=call.id,
                tool_call_name=call.name,
                tool_call_arguments=call.arguments,
            )
        )


@dataclass
class CallParse:
    """What ``StreamParser.parse_call`` found at a marker: ``calls`` (possibly none: a marker that is only
    dropped) and ``end``, how much of the buffer they took. ``end < 0``: not a call."""

    calls: list[ToolCall]
    end: int


NOT_A_CALL = CallParse([], -1)


class StreamParser(ChatParser):
    """The common machinery: a reasoning block at the start (``think``), then content in which
    ``call_start`` marks where a tool call (or a tag to drop) may begin; ``parse_call`` reads it.

    ``call_at_start`` is a pattern only tried while no content has been emitted yet (Llama 3's bare
    JSON calls). Families override ``parse_call`` and set the patterns; patterns are ``regex`` module
    patterns, matched with ``partial=True`` so that a possible start at the end of the text is held."""

    think: ThinkTags | None = THINK
    call_start: regex.Pattern | None = None
    call_at_start: regex.Pattern | None = None

    def __init__(self, syntax: ChatSyntax) -> None:
        super().__init__(syntax)
        self._strip = StrippedText()
        self._marker_len = 0
        self.json_cache: dict = {}  # for read_json on the buffer while it only grows (a call being read)
        reasoning = self.think is not None and syntax.reasoning_format != "none"
        if reasoning and syntax.thinking_forced_open:
            self._mode = "open"
        elif reasoning:
            self._mode = "start"
        else:
            self._mode = "content"

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        """Read a call at the start of ``buf`` (the marker found by ``call_start``); None: need more text."""
        return NOT_A_CALL

    def not_a_call(self, buf: str) -> int:
        """The marker turned out not to start a call: emit it as content; returns how much was used."""
        self._content(buf[: self._marker_len])
        return self._marker_len

    def _step(self, final: bool) -> bool:
        buf, mode = self._buf, self._mode
        if mode in ("start", "open", "after_think"):
            assert self.think is not None
            tag = self.think.start
            rest = buf.lstrip()
            if rest.startswith(tag):
                self._buf = rest[len(tag) :]
                self._strip.open()
                self._mode = "think"
                return True
            if not final and tag.startswith(rest):
                if mode == "after_think":
                    self._buf = rest
                return False
            if mode == "open":
                self._strip.open()
                self._mode = "think"
            else:
                self._buf = buf if mode == "start" else rest
                self._mode = "content"
            return True
        if mode == "think":
            assert self.think is not None
            end = buf.find(self.think.end)
            if end >= 0:
                self._reasoning(self._strip.push(buf[:end]))
                self._buf = buf[end + len(self.think.end) :]
                self._mode = "after_think"
                return True
            keep = 0 if final else partial_suffix(buf, self.think.end)
            self._reasoning(self._strip.push(buf[: len(buf) - keep]))
            self._buf = buf[len(buf) - keep :]
            return False
        if mode == "after_call":
            rest = buf.lstrip()
            self._buf = rest
            if not rest and not final:
                return False
            self._mode = "content"
            return bool(rest)
        if mode == "content":
            if not buf:
                return False
            if self.call_start is None and self.call_at_start is None:
                self._content(buf)
                self._buf = ""
                return False
            m = None
            if self.call_at_start is not None and not self._msg.content:
                m = self.call_at_start.match(buf, partial=not final)
                if m is not None and (m.partial or m.end() > m.start()):
                    if m.partial:
                        return False
                else:
                    m = None
            if m is None and self.call_start is not None:
                m = self.call_start.search(buf, partial=not final)
            if m is None:
                self._content(buf)
                self._buf = ""
                return False
            self._content(buf[: m.start()])
            self._buf = buf[m.start() :]
            if m.partial:
                return False
            self._marker_len = max(1, m.end() - m.start())
            self._mode = "call"
            return True
        # mode == "call"
        res = self.parse_call(buf, final)
        if res is None:
            if not final:
                return False
            res = NOT_A_CALL
        self.json_cache.clear()
        if res.end < 0:
            self._buf = buf[self.not_a_call(buf) :]
            self._mode = "content"
            return True
        for call in res.calls:
            self._call(call)
        self._buf = buf[res.end :]
        self._mode = "after_call" if res.calls else "content"
        return True


def expect_tag(buf: str, i: int, tag: str, final: bool) -> int | None:
    """After optional whitespace at ``i``, ``tag``: the index after it; None when the text stops inside it
    (need more); at the end of generation a missing tag with nothing else left is accepted (the end of
    the text); -1 when something else is there."""
    j = skip_ws(buf, i)
    if buf.startswith(tag, j):
        return j + len(tag)
    rest = buf[j:]
    if not final and tag.startswith(rest):
        return None
    if final and not rest:
        return j
    return -1


# --- grammar helpers ---


def functions_of(tools: Sequence[dict] | None) -> list[dict]:
    """The function definitions (name, parameters, description) of OpenAI ``tools``, their parameters
    made :func:`self_contained`."""
    out = []
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) and "function" in tool else tool
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        params = self_contained(params, len(out)) if isinstance(params, dict) else {"type": "object"}
        out.append({**fn, "parameters": params})
    return out


_DEFS_KEYS = ("$defs", "definitions")


def _has_local_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return True
        return any(_has_local_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_local_ref(v) for v in schema)
    return False


def self_contained(params: dict, index: int) -> dict:
    """Tool parameters whose local ``$ref``s (``#/$defs/X``, ``#``: what pydantic and zod write) keep
    their meaning when a grammar embeds the schema in a call's ``{"name", "arguments"}`` object: an
    ``$id`` makes the parameters the resource their ``#`` refers to. (One parameter's schema on its own:
    :func:`parameter_schemas`.) A schema without local refs is returned as it is; the request's own tools
    are never changed."""
    if not _has_local_ref(params) or isinstance(params.get("$id"), str):
        return params
    return {**params, "$id": f"urn:llamapy:tool:{index}"}


_PARAMS_DEF = "llamapy_tool_parameters"


def _rebase_refs(schema: Any, defs: dict) -> Any:
    """``schema`` with each local ``$ref`` that does not name one of ``defs`` (``#``, ``#/properties/...``)
    pointed into the parameters' copy at ``#/$defs/{_PARAMS_DEF}``."""
    if isinstance(schema, list):
        return [_rebase_refs(v, defs) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebase_refs(v, defs) for k, v in schema.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        parts = ref.split("/")
        if not (len(parts) >= 3 and parts[0] == "#" and isinstance(defs.get(parts[1]), dict)):
            out["$ref"] = f"#/$defs/{_PARAMS_DEF}" + ref[1:]
    return out


def parameter_schemas(params: dict) -> list[tuple[str, Any]]:
    """``(name, schema)`` of each parameter, each schema valid on its own (for the families that write
    parameters one by one): where the parameters have local ``$ref``s, a parameter's schema carries the
    parameters' definitions, and its refs to anything else (``#``) point into a copy of the parameters."""
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    if not _has_local_ref(params):
        return list(props.items())
    defs = {k: params[k] for k in _DEFS_KEYS if isinstance(params.get(k), dict)}
    root = _rebase_refs({k: v for k, v in params.items() if k != "$id"}, defs)
    extra = {k: root[k] for k in defs}
    extra["$defs"] = {**extra.get("$defs", {}), _PARAMS_DEF: root}
    out = []
    for key, schema in props.items():
        if isinstance(schema, dict) and _has_local_ref(schema):
            schema = {**_rebase_refs(schema, defs), **extra}
        out.append((key, schema))
    return out


def parameter_tables(tools: Sequence[dict] | None) -> dict[str, dict[str, Any]]:
    """Each function's ``{parameter: schema}`` (schemas from :func:`parameter_schemas`), for parsers that
    read parameters one by one."""
    return {f["name"]: dict(parameter_schemas(f["parameters"])) for f in functions_of(tools)}


def choose_functions(tools: Sequence[dict] | None, tool_choice: str | dict) -> list[dict] | None:
    """The functions a request allows: all for ``auto``/``required``, one for a named choice, None for
    ``none`` (or no tools)."""
    funcs = functions_of(tools)
    if tool_choice == "none" or not funcs:
        return None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        name = fn.get("name")
        chosen = [f for f in funcs if f["name"] == name]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        return chosen
    if tool_choice not in ("auto", "required"):
        raise ValueError(f"tool_choice must be 'auto', 'required', 'none' or a function, got {tool_choice!r}")
    return funcs


def lark_str(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def regex_escape(text: str) -> str:
    """``text`` escaped for a Rust regex inside Lark's ``/.../``."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~/" else c for c in text)


def json_rule(schema: Any) -> str:
    """An inline JSON-schema rule body, as ``LlamaGrammar.from_json_schema`` (and llama.cpp) read a schema
    for generation: ``additionalProperties`` false where an object lists ``properties`` and says nothing
    else (a small model otherwise invents keys forever), whitespace bounded (``WS_PATTERN``, whatever the
    schema's own ``x-guidance`` options say)."""
    if isinstance(schema, dict):
        from ..grammar.grammar import default_no_additional_properties

        schema = json.loads(json.dumps(schema))  # (a copy: the request's tools stay as they were)
        default_no_additional_properties(schema)
        options = schema.get("x-guidance")
        options = dict(options) if isinstance(options, dict) else {}
        options.pop("whitespace_flexible", None)
        schema["x-guidance"] = {**options, "whitespace_pattern": WS_PATTERN}
    return "%json " + json.dumps(schema, ensure_ascii=False)


def one_of(schemas: list[dict]) -> dict:
    """One schema, or ``anyOf`` several."""
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


#: The whitespace a generated grammar allows between two of its parts, llama.cpp's ``SPACE`` rule (of
#: json-schema-to-grammar and chat.cpp's tool grammars): nothing, one space, or one or two newlines and up
#: to 20 spaces or tabs; JSON inside a grammar (``json_rule``) uses it too. No grammar accepts more than
#: ``MAX_WS`` whitespace characters in a row outside free text, so a model cannot stall on whitespace.
WS_PATTERN = r"(?: |\n{1,2}[ \t]{0,20})"
MAX_WS = 22
WS = f"/{WS_PATTERN}?/"
#: A run that is not empty, for between two JSON values: where the run may be empty llguidance lets the
#: JSON's own whitespace (``WS_PATTERN`` again) precede the second value, doubling the bound.
WS1 = f"/{WS_PATTERN}/"
#: What may follow the last call (after its closing tag, if the family has one): at most one newline,
#: then only end-of-generation (``assemble`` ends every grammar with it).
TAIL = r"/\n?/"


def is_string_schema(schema: Any) -> bool:
    """A parameter whose value is written raw, not as JSON (type string, or string-or-null; also through a
    ``$ref`` to the definitions :func:`self_contained` gave the parameter)."""
    root = schema
    for _ in range(8):  # (a chain of refs to refs; a cycle is not a string)
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not (isinstance(ref, str) and "type" not in schema):
            break
        parts = ref.split("/")
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in _DEFS_KEYS:
            break
        defs = root.get(parts[1])
        schema = defs.get(parts[2]) if isinstance(defs, dict) else None
    t = schema.get("type") if isinstance(schema, dict) else None
    types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
    return "string" in types and types <= {"string", "null"}


@dataclass
class GrammarRequest:
    """What a grammar is built from: the allowed functions and the request's choices.

    ``is_special(text)`` says whether the vocabulary has ``text`` as a special token: its token id (an
    int) references it by id (``<[id]>``, works for any token), ``True`` by its text (``<|name|>``, which
    llguidance supports only for texts in angle brackets: ``True`` for ``[TOOL_CALLS]`` is an error),
    ``False``/``None``: not special, a plain string."""

    functions: list[dict]
    required: bool
    parallel: bool
    is_special: Callable[[str], Any]
    thinking_forced_open: bool = False

    def special(self, text: str) -> str | None:
        """The Lark reference to the special token ``text``, or None when it is not one."""
        r = self.is_special(text)
        if isinstance(r, int) and not isinstance(r, bool):
            return f"<[{r}]>"
        if not r:
            return None
        if text.startswith("<") and text.endswith(">") and ">" not in text[1:-1]:
            return text
        raise ValueError(
            f"the special token {text!r} can only be referenced by id: is_special must return it"
        )

    def lit(self, text: str) -> str:
        """``text`` as a Lark element: a special token when the vocabulary has it, else a string."""
        return self.special(text) or lark_str(text)

    def until(self, name: str, end: str) -> tuple[str, list[str]]:
        """Free text up to and including ``end``: the element, and the rules it needs."""
        ref = self.special(end)
        if ref is not None:
            return rf"/(?s:.*)/ {ref}", []
        return name, [rf"{name}[lazy]: /(?s:.*){regex_escape(end)}/"]

    def calls(self, call: str) -> str:
        """One call, or one or more (separated by whitespace) when parallel calls are allowed."""
        return f"{call} ({WS} {call})*" if self.parallel else call


def reasoning_prefix(req: GrammarRequest, think: ThinkTags | None) -> tuple[str, list[str]]:
    """For ``required`` grammars (constrained from the first token): the reasoning block the answer may
    start with (mandatory when the prompt opened it), as an element and its rules; nothing for lazy ones."""
    if think is None or not req.required:
        return "", []
    body, rules = req.until("think_text", think.end)
    if req.thinking_forced_open:
        return f"{body} {WS}", rules
    return f"({req.lit(think.start)} {body} {WS})?", rules


def call_trigger(start_pattern: str, think: ThinkTags | None, forced_open: bool) -> tuple[str, str]:
    """A ``pattern_full`` trigger at ``start_pattern`` (a Python regex, the call's first text) that
    does not fire inside a reasoning block; without reasoning, a plain ``pattern``."""
    if think is None:
        return ("pattern", f"({start_pattern})")
    s, e = regex.escape(think.start), regex.escape(think.end)
    head = rf"[\s\S]*?{e}" if forced_open else rf"(?:\s*{s}[\s\S]*?{e})?"
    return ("pattern_full", rf"^{head}(?:(?!{s})[\s\S])*?({start_pattern})[\s\S]*$")


def call_triggers(
    req: GrammarRequest, think: ThinkTags | None, call_start: str
) -> tuple[tuple[str, str], ...]:
    """The triggers of a lazy (``auto``) grammar: the call's first text ``call_start``, outside any
    reasoning block; none for a ``required`` grammar (constrained from the first token)."""
    if req.required:
        return ()
    if think is None:
        return (("word", call_start),)
    return (call_trigger(regex.escape(call_start), think, req.thinking_forced_open),)


def assemble(rules: list[str]) -> str:
    """Lark source from rules (the first is ``start``), ``start`` ending with ``TAIL``: after the calls at
    most one newline, then end-of-generation (no rule may end with ``WS``: the run would exceed ``MAX_WS``)."""
    head, sep, body = rules[0].partition(":")
    if head.strip() != "start" or not sep:
        raise ValueError(f"the first rule must be start, got {rules[0]!r}")
    return "\n".join([f"start: ({body.strip()}) {TAIL}", *rules[1:]]) + "\n"


# --- formats ---


def _never(_: str) -> bool:
    return False


class ChatFormat:
    """One model family's tool-call and reasoning syntax. ``detect_format`` returns an instance."""

    name = "content-only"
    supports_tools = False
    think: ThinkTags | None = THINK
    object_arguments = False  # the template wants assistant tool-call arguments as objects
    preserved: tuple[str, ...] = ()

    def __init__(self, source: str | None = None) -> None:
        self.source = source or ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        """OpenAI messages made into what this template expects (copies; the input is not changed)."""
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [self.prepare_call(c) for c in m["tool_calls"]]
                if m.get("content") is None:
                    m["content"] = ""
            out.append(m)
        return out

    def prepare_call(self, call: dict) -> dict:
        """One assistant tool call for the template (arguments parsed into an object if it wants them)."""
        call = dict(call)
        fn = dict(call.get("function") or {})
        args = fn.get("arguments")
        if self.object_arguments and isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                fn["arguments"] = parsed
        call["function"] = fn
        call.setdefault("type", "function")
        return call

    def template_kwargs(
        self, tools: list[dict] | None, tool_choice: str | dict = "auto", parallel_tool_calls: bool = True
    ) -> dict:
        """Extra render arguments this template needs."""
        return {}

    def grammar(
        self,
        tools: list[dict] | None,
        tool_choice: str | dict = "auto",
        parallel_tool_calls: bool = True,
        is_special: Callable[[str], Any] = _never,
        thinking_forced_open: bool = False,
    ) -> ToolGrammar | None:
        """The grammar for a tool call: lazy for ``auto``, from the first token for ``required`` or a
        named function, None for ``none`` or no tools. ``is_special``: see :class:`GrammarRequest`;
        ``thinking_forced_open``: the prompt opened the reasoning block (``required`` grammars then start
        with its text and closing tag; ``auto`` triggers only after it)."""
        if not self.supports_tools:
            return None
        funcs = choose_functions(tools, tool_choice)
        if funcs is None:
            return None
        named = isinstance(tool_choice, dict)  # one call of that function, then the end
        req = GrammarRequest(
            funcs, tool_choice != "auto", parallel_tool_calls and not named, is_special, thinking_forced_open
        )
        return self.build_grammar(req)

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        """The family's grammar for ``req``."""
        raise NotImplementedError

    def finish_prompt(self, prompt: str, add_generation_prompt: bool) -> str:
        """The rendered prompt, amended where the family's template leaves the generation prompt out
        (as llama.cpp does after rendering); unchanged by default."""
        return prompt

    def thinking_forced_open(self, prompt_text: str) -> bool:
        """Whether the rendered prompt ends inside an open reasoning block."""
        return self.think is not None and prompt_opens_block(prompt_text, self.think)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        """A parser for one generation."""
        raise NotImplementedError
