"""Llama 3.1 / 3.2 / 3.3: a JSON call ``{"name": ..., "parameters": {...}}`` at the start of the answer,
and (3.1, 3.3) built-in tools after ``<|python_tag|>``: ``brave_search.call(query="...")``.

As llama.cpp, a JSON call is recognised only at the start of the answer (several may follow each
other, separated by ``;``); ``<|python_tag|>`` followed by JSON is a call too, and followed by plain
code it is a call of ``python`` with ``{"code": ...}``.
"""

from __future__ import annotations

import datetime
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
    call_from_object,
    functions_of,
    json_rule,
    lark_str,
    one_of,
    parameter_schemas,
    read_json,
    skip_ws,
)

PYTHON_TAG = "<|python_tag|>"
BUILTIN_TOOLS = ("wolfram_alpha", "brave_search", "web_search", "python", "code_interpreter")
_JSON_CALL = regex.compile(r'\s*;?\s*(\{)\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')
_TAG = regex.compile(regex.escape(PYTHON_TAG))
_BUILTIN = regex.compile(r"\s*(\w+)\s*\.\s*call\(")
_ARG = regex.compile(r"\s*(\w+)\s*=\s*")


class Llama3Parser(StreamParser):
    """Parser of Llama 3.x output."""

    call_at_start = _JSON_CALL
    call_start = _TAG

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        if buf.startswith(PYTHON_TAG):
            return self._python_tag(buf, len(PYTHON_TAG), final)
        m = _JSON_CALL.match(buf)
        return self._json_call(buf, m.start(1)) if m else NOT_A_CALL

    def _json_call(self, buf: str, i: int) -> CallParse | None:
        got = read_json(buf, i, self.json_cache)
        if got is PARTIAL:
            return None
        if got is None:
            return NOT_A_CALL
        value, end = got
        call = call_from_object(value, args_keys=("parameters", "arguments"))
        return CallParse([call], end) if call else NOT_A_CALL

    def _python_tag(self, buf: str, i: int, final: bool) -> CallParse | None:
        m = _BUILTIN.match(buf, i, partial=not final)
        if m is not None and m.partial:
            return None
        if m is not None:
            args: dict = {}
            j = m.end()
            while True:
                j = skip_ws(buf, j)
                if buf.startswith(")", j):
                    return CallParse([ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))], j + 1)
                a = _ARG.match(buf, j, partial=not final)
                if a is None:
                    return NOT_A_CALL
                if a.partial:
                    return None
                got = read_json(buf, a.end(), self.json_cache)
                if got is PARTIAL:
                    return None if not final else NOT_A_CALL
                if got is None:
                    return NOT_A_CALL
                args[a.group(1)], j = got
                j = skip_ws(buf, j)
                if buf.startswith(",", j):
                    j += 1
                elif j >= len(buf):
                    return None if not final else NOT_A_CALL
        j = skip_ws(buf, i)
        if buf.startswith("{", j):
            return self._json_call(buf, j)
        if not final:
            return None
        return CallParse([ToolCall("python", json.dumps({"code": buf[i:]}, ensure_ascii=False))], len(buf))


class Llama3Format(ChatFormat):
    """Templates with an ``ipython`` role (Llama 3.1, 3.2, 3.3); built-in tools where the template
    knows ``<|python_tag|>``."""

    name = "llama-3.x"
    supports_tools = True
    object_arguments = True
    preserved = (PYTHON_TAG,)

    @property
    def allows_builtin_tools(self) -> bool:
        """Whether the template renders built-in tool calls (``<|python_tag|>``)."""
        return PYTHON_TAG in self.source

    def _builtins(self, tools: list[dict] | None) -> list[dict]:
        if not self.allows_builtin_tools:
            return []
        return [
            f for f in functions_of(tools) if f["name"] in BUILTIN_TOOLS and f["parameters"].get("properties")
        ]

    def template_kwargs(
        self, tools: list[dict] | None, tool_choice: str | dict = "auto", parallel_tool_calls: bool = True
    ) -> dict:
        kwargs: dict = {
            "date_string": datetime.date.today().strftime("%d %b %Y"),
            "tools_in_user_message": False,
        }
        builtins = [f["name"] for f in self._builtins(tools)]
        if builtins:
            kwargs["builtin_tools"] = builtins
        return kwargs

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        schemas = [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "parameters": f["parameters"]},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for f in req.functions
        ]
        rules = [f"call_json: {json_rule(one_of(schemas))}"]
        alts = ["call_json"]
        builtin_names = {f["name"] for f in self._builtins(req.functions)}
        for k, f in enumerate(fn for fn in req.functions if fn["name"] in builtin_names):
            parts = []
            for j, (key, schema) in enumerate(parameter_schemas(f["parameters"])):
                rules.append(f"b{k}_a{j}: {json_rule(schema)}")
                parts.append(f"{lark_str(key + '=')} b{k}_a{j}")
            args = ' ", " '.join(parts)
            rules.append(f'b{k}: {req.lit(PYTHON_TAG)} {lark_str(f["name"] + ".call(")} {args} ")"')
            alts.append(f"b{k}")
        call = f"({' | '.join(alts)})"
        calls = f'{call} ({WS} ";" {WS} {call})*' if req.parallel else call
        rules.insert(0, f"start: {WS} {calls}")
        triggers: tuple[tuple[str, str], ...] = ()
        if not req.required:
            triggers = (
                ("pattern_full", r'^\s*(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*")[\s\S]*'),
            )
            if builtin_names:
                triggers += (("word", PYTHON_TAG),)
        return ToolGrammar(assemble(rules), triggers, self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return Llama3Parser(syntax)
