"""The fallback for templates without a known tool-call syntax, and plain content.

Generic (llama.cpp's generic handler): the whole answer is one JSON object, ``{"tool_call": {"name":
..., "arguments": {...}}}``, ``{"tool_calls": [...]}`` (parallel calls) or ``{"response": "..."}``; the
grammar constrains it from the first token, and ``prepare_messages`` tells the model so in a system
message, with the tool list when the template does not show tools itself, and writes earlier calls
and tool results as JSON text when the template does not render them. A ``response`` string is
streamed as it is decoded. An answer that is not such JSON is content.
"""

from __future__ import annotations

import json

import regex

from .common import (
    PARTIAL,
    ChatFormat,
    ChatParser,
    ChatSyntax,
    GrammarRequest,
    StreamParser,
    ToolGrammar,
    assemble,
    call_from_object,
    functions_of,
    json_rule,
    one_of,
    plain_calls,
    read_json,
)
from .syntax import FAIL, NEED, Lark, Node, Scan

RESPOND_IN_JSON = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to "
    "the user's request"
)
_CHARS = regex.compile(r'(?:[^"\\]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_HIGH_SURROGATE = regex.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")
_ESCAPE_PREFIX = regex.compile(r"\\(?:u[0-9a-fA-F]{0,4})?")
_PENDING = regex.compile(r"(?:\\u[dD][89abAB][0-9a-fA-F]{2})?\\(?:u[0-9a-fA-F]{0,4})?")


class JsonAnswer(Node):
    """The whole answer as one JSON object: ``{"tool_calls": [call, ...]}`` (parallel calls allowed),
    ``{"tool_call": call}`` or (a call not required) ``{"response": "..."}``, a call ``{"name",
    "arguments"}`` (and an ``id``). The parser also takes the other two call keys whatever the request,
    extra keys, and a ``response`` of any JSON value (content: a string as it is, another value as indented
    JSON); model-made ids (``call_1___``) are dropped, not being unique. ``response``: the start of an
    answer whose ``response`` string the parser streams as it is decoded."""

    response = regex.compile(r'\s*\{\s*"response"\s*:\s*"')

    def parse(self, s: Scan, i: int) -> int | None:
        got = read_json(s.buf, i, s.json_cache)
        if got is PARTIAL:
            return FAIL if s.final else NEED
        if got is None or not isinstance(got[0], dict):  # type: ignore[index]
            return FAIL
        value, end = got  # type: ignore[misc]
        if isinstance(value.get("tool_calls"), list):
            calls = [call_from_object(c) for c in value["tool_calls"]]
        elif "tool_call" in value:
            calls = [call_from_object(value["tool_call"])]
        elif "response" in value:
            r = value["response"]
            s.content = r if isinstance(r, str) else json.dumps(r, indent=2, ensure_ascii=False)
            return end
        else:
            return FAIL
        if not calls or any(c is None for c in calls):
            return FAIL
        for c in calls:
            c.id = ""  # type: ignore[union-attr]
        s.calls.extend(calls)  # type: ignore[arg-type]
        return end

    def lark(self, g: Lark) -> str:
        req, calls = g.req, []
        for f in req.functions:
            schema: dict = {
                "type": "object",
                "properties": {"name": {"type": "string", "const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"],
                "additionalProperties": False,  # the wrappers take no extra keys a model could ramble in
            }
            if f.get("description"):
                schema["description"] = f["description"]
            if req.parallel:  # bounded (llama.cpp's is not): a small model can ramble on an id forever
                schema["properties"]["id"] = {"type": "string", "minLength": 4, "maxLength": 12}
                schema["required"].append("id")
            calls.append(schema)
        if req.parallel:
            items = {"type": "array", "items": one_of(calls), "minItems": 1}
            answer = {"type": "object", "properties": {"tool_calls": items}, "required": ["tool_calls"]}
        else:
            answer = {"type": "object", "properties": {"tool_call": one_of(calls)}, "required": ["tool_call"]}
        answer["additionalProperties"] = False
        if not req.required:
            response = {
                "type": "object",
                "properties": {"response": {"type": "string"}},
                "required": ["response"],
                "additionalProperties": False,
            }
            answer = {"anyOf": [answer, response]}
        return json_rule(answer)

    def start(self) -> tuple[str, bool]:
        return r"\s*\{", False


ANSWER = JsonAnswer()


class ContentOnlyParser(StreamParser):
    """Content and a ``<think>`` block; no tool calls."""


class GenericParser(StreamParser):
    """Parser of the generic JSON answer."""

    def _step(self, final: bool) -> bool:
        mode, buf = self._mode, self._buf
        if mode == "content":  # undecided: what kind of answer is this?
            head = buf.lstrip()[:1]
            if not self.syntax.parse_tool_calls or head not in ("", "{"):
                self._mode = "raw"
                return True
            if not head:
                if final:
                    self._mode = "raw"
                return final
            m = ANSWER.response.match(buf, partial=not final)
            if m is not None and m.partial:
                return False
            if m is not None:
                self._buf, self._mode = buf[m.end() :], "response"
                return True
            scan = Scan(buf, final, json_cache=self.json_cache)
            end = ANSWER.parse(scan, 0)
            if end is NEED:
                return False
            self.json_cache.clear()
            if end == FAIL:
                self._mode = "raw"
            else:
                self._content(scan.content)
                for c in scan.calls:
                    self._call(c)
                self._buf, self._mode = buf[end:], "tail"
            return True
        if mode == "raw":
            self._content(buf)
            self._buf = ""
            return False
        if mode == "response":  # inside the response string: decode what is complete
            m = _CHARS.match(buf)
            chunk, rest = m.group(), buf[m.end() :]
            if not final and (not rest or _ESCAPE_PREFIX.fullmatch(rest)):
                h = _HIGH_SURROGATE.search(chunk)
                if h:  # wait for the low half of a surrogate pair
                    chunk, rest = chunk[: h.start()], chunk[h.start() :] + rest
            self._content(json.loads('"' + chunk + '"', strict=False))
            self._buf = rest
            if rest.startswith('"'):
                self._buf, self._mode = rest[1:], "response_end"
                return True
            if rest.startswith("\\"):
                if not final and _PENDING.fullmatch(rest):
                    return False
                self._content(rest[1:2])  # an invalid escape: keep the character
                self._buf = rest[2:]
                return True
            return False
        if mode in ("response_end", "tail"):
            rest = buf.lstrip()
            self._buf = rest
            if not rest:
                return False
            if mode == "response_end" and rest.startswith("}"):
                self._buf, self._mode = rest[1:], "tail"
            else:
                self._mode = "raw"
            return True
        return super()._step(final)


class ContentOnlyFormat(ChatFormat):
    """No tool calls; a leading ``<think>`` block is reasoning."""

    name = "content-only"

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return ContentOnlyParser(syntax)


def _example() -> str:
    call = {"name": "tool_name", "arguments": {"arg1": "some_value"}, "id": "call_1___"}
    return json.dumps({"tool_calls": [call]}, indent=2)


class GenericFormat(ChatFormat):
    """The JSON fallback (llama.cpp's generic handler)."""

    name = "generic"
    supports_tools = True

    @property
    def shows_tools(self) -> bool:
        """Whether the template describes the ``tools`` itself."""
        return regex.search(r"\btools\b", self.source) is not None

    @property
    def renders_tool_calls(self) -> bool:
        """Whether the template renders assistant ``tool_calls`` itself."""
        return "tool_calls" in self.source

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        if self.renders_tool_calls:
            out = super().prepare_messages(messages, tools)
        else:
            out = []
            for m in messages:
                m = dict(m)
                if m.get("tool_calls"):
                    calls = plain_calls(m.pop("tool_calls"), with_ids=True)
                    m["content"] = json.dumps({"tool_calls": calls}, indent=2, ensure_ascii=False)
                elif m.get("role") == "tool":
                    result = {
                        "tool": m.get("name"),
                        "content": m.get("content"),
                        "tool_call_id": m.get("tool_call_id"),
                    }
                    text = json.dumps({"tool_response": result}, indent=2, ensure_ascii=False)
                    if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                        out[-1]["content"] += "\n" + text
                        continue
                    m = {"role": "user", "content": text, "_tool_results": True}
                out.append(m)
            out = [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
        funcs = functions_of(tools)
        if not funcs:
            return out
        note = RESPOND_IN_JSON
        if not self.shows_tools:
            listing = json.dumps(tools, indent=2, ensure_ascii=False)
            note = (
                f"You can call any of the following tools to satisfy the user's requests: {listing}\n\n"
                f"Example tool call syntax:\n\n{_example()}\n\n{note}"
            )
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + note}
        else:
            out.insert(0, {"role": "system", "content": note})
        return out

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        return ToolGrammar(assemble([f"start: {ANSWER.lark(Lark(req))}"]), (), ())

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return GenericParser(syntax)
