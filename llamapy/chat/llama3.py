"""Llama 3.1 / 3.2 / 3.3: a JSON call ``{"name": ..., "parameters": {...}}`` at the start of the answer,
and (3.1, 3.3) built-in tools after ``<|python_tag|>``: ``brave_search.call(query="...")``.

As llama.cpp, a JSON call is recognised only at the start of the answer (several may follow each
other, separated by ``;``); ``<|python_tag|>`` followed by JSON is a call too, and followed by plain
code it is a call of ``python`` with ``{"code": ...}``.
"""

from __future__ import annotations

import regex

from .common import (
    WS,
    ChatFormat,
    functions_of,
    json_rule,
    lark_str,
    parameter_schemas,
    read_json,
    skip_ws,
)
from .syntax import (
    FAIL,
    NEED,
    Lark,
    Node,
    Scan,
    SyntaxFormat,
    ToolSyntax,
    accept,
    alt,
    code,
    function,
    json_calls,
    lit,
    seq,
    tool_syntax,
    ws,
)

PYTHON_TAG = "<|python_tag|>"
BUILTIN_TOOLS = ("wolfram_alpha", "brave_search", "web_search", "python", "code_interpreter")
_ARG = regex.compile(r"\s*(\w+)\s*=\s*")


def _is_builtin(f: dict) -> bool:
    return f["name"] in BUILTIN_TOOLS and bool(f["parameters"].get("properties"))


class Kwargs(Node):
    """A built-in tool's keyword arguments ``key=JSON, ...)``: parsed in any order, written in the
    schema's order, every parameter."""

    def parse(self, s: Scan, i: int) -> int | None:
        buf, args = s.buf, {}
        while True:
            i = skip_ws(buf, i)
            if buf.startswith(")", i):
                s.args = args
                return i + 1
            a = _ARG.match(buf, i, partial=not s.final)
            if a is None or a.partial:
                return FAIL if a is None else NEED
            got = read_json(buf, a.end(), s.json_cache)
            if got is None or not isinstance(got, tuple):
                return FAIL if got is None or s.final else NEED
            args[a.group(1)], i = got
            i = skip_ws(buf, i)
            if buf.startswith(",", i):
                i += 1
            elif i >= len(buf):
                return FAIL if s.final else NEED

    def lark(self, g: Lark) -> str:
        assert g.function is not None
        parts = []
        for j, (key, schema) in enumerate(parameter_schemas(g.function["parameters"])):
            parts.append(f"{lark_str(key + '=')} {g.rule(f'f{g.k}_a{j}', json_rule(schema))}")
        return " ".join([' ", " '.join(parts), '")"']).strip()

    def start(self) -> tuple[str, bool]:
        return "", False


def _llama3_call(f: dict) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": f["name"]}, "parameters": f["parameters"]},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


KEYS = ("parameters", "arguments")


def _syntax(builtins: bool) -> ToolSyntax:
    """JSON calls at the start of the answer (``;`` between), and after ``<|python_tag|>`` a built-in
    tool's call (written where the template has them), a JSON call or raw code (``python``)."""
    first = r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"'
    after_tag = alt(
        function(
            PYTHON_TAG + "{name}.call(",
            Kwargs(),
            pattern=r"<\|python_tag\|>\s*(\w+)\s*\.\s*call\(",
            only=_is_builtin if builtins else lambda f: False,
        ),
        accept(seq(lit(PYTHON_TAG), ws(), json_calls(one=True, first=r"\{", keys=KEYS))),
        accept(seq(lit(PYTHON_TAG), code(call=True, guard=r"\s*(?:\{|\w+\s*\.\s*call\()"))),
    )
    return tool_syntax(
        after_tag,
        tokens=(PYTHON_TAG,),
        sep=f'{WS} ";" {WS}',
        lead=WS,
        at_start=json_calls(one=True, first=first, keys=KEYS, item=_llama3_call),
        at_start_skip=r"\s*;?\s*",
    )


SYNTAXES = {b: _syntax(b) for b in (False, True)}


class Llama3Format(SyntaxFormat, ChatFormat):
    """Templates with an ``ipython`` role (Llama 3.1, 3.2, 3.3); built-in tools where the template
    knows ``<|python_tag|>``."""

    name = "llama-3.x"
    object_arguments = True
    preserved = (PYTHON_TAG,)

    @property
    def allows_builtin_tools(self) -> bool:
        """Whether the template renders built-in tool calls (``<|python_tag|>``)."""
        return PYTHON_TAG in self.source

    def _builtins(self, tools: list[dict] | None) -> list[dict]:
        if not self.allows_builtin_tools:
            return []
        return [f for f in functions_of(tools) if _is_builtin(f)]

    def template_kwargs(
        self, tools: list[dict] | None, tool_choice: str | dict = "auto", parallel_tool_calls: bool = True
    ) -> dict:
        kwargs: dict = {"tools_in_user_message": False}  # (date_string: api.chat_request.template_context)
        builtins = [f["name"] for f in self._builtins(tools)]
        if builtins:
            kwargs["builtin_tools"] = builtins
        return kwargs

    @property
    def tool(self) -> ToolSyntax:  # type: ignore[override]
        return SYNTAXES[self.allows_builtin_tools]

    def grammar_think(self) -> None:  # (no reasoning in its grammars)
        return None
