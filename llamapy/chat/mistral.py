"""Mistral: ``[TOOL_CALLS]`` then the calls.

Two syntaxes, chosen by what the template renders: Mistral Nemo's JSON array
``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcDEF123"}]``, and the newer
``[TOOL_CALLS]name[ARGS]{...}`` (Mistral Small 3.2 adds ``[CALL_ID]id`` before ``[ARGS]``; Devstral,
Ministral 3). Call ids are Mistral's 9 letters and digits: kept when the model writes them, else
generated. Templates with ``[THINK]`` (Magistral, Ministral 3 Reasoning) reason in ``[THINK]...[/THINK]``.
"""

from __future__ import annotations

import hashlib
import re

from .common import ChatFormat, ChatParser, ChatSyntax, lark_str, random_id
from .reasoning import MISTRAL_THINK, ThinkTags
from .syntax import (
    Lark,
    Node,
    SyntaxFormat,
    ToolSyntax,
    accept,
    alt,
    call_schemas,
    function,
    json_args,
    json_calls,
    lit,
    seq,
    tool_syntax,
    ws,
)

TOOL_CALLS = "[TOOL_CALLS]"
_ID = re.compile(r"[A-Za-z0-9]{9}")
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _nemo_call(f: dict) -> dict:
    """A Nemo call object: ``call_schemas``' with Mistral's 9-character id."""
    (schema,) = call_schemas([f])
    schema["properties"]["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
    schema["required"].append("id")
    return schema


# [{"name": ..., "arguments": {...}, "id": "abcDEF123"}]
NEMO = json_calls(array=True, first=r"\[", only_array=True, comma=False, keys=("arguments",), item=_nemo_call)


def _named(with_ids: bool) -> Node:
    """``name[CALL_ID]id[ARGS]{...}`` (``[CALL_ID]`` in the grammar where ``with_ids``)."""

    def head(g: Lark, name: str) -> str:
        call_id = f" {g.req.lit('[CALL_ID]')} /[a-zA-Z0-9]{{9}}/" if with_ids else ""
        return f"{lark_str(name)}{call_id} {g.req.lit('[ARGS]')}"

    return function(
        "{name}[ARGS]",
        json_args(),
        pattern=r"\s*([^\[\]\s{}]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?\[ARGS\]",
        call_id=lambda m: m.group(2) or "",
        head=head,
    )


def _syntax(named: bool, with_ids: bool) -> ToolSyntax:
    """``[TOOL_CALLS]`` then the calls the template renders; the parser takes both syntaxes."""
    calls = alt(_named(with_ids), accept(NEMO)) if named else alt(NEMO, accept(_named(False)))
    return tool_syntax(seq(lit(TOOL_CALLS, True), ws(""), calls), repeat=named)


SYNTAXES = {(n, i): _syntax(n, i) for n, i in ((False, True), (True, False), (True, True))}


def mistral_id(call_id: str | None, salt: str = "") -> str:
    """A 9-character alphanumeric id for ``call_id``: itself when it already is one, else derived from
    it (the same input always gives the same id)."""
    if call_id and _ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(f"{call_id}\0{salt}".encode()).digest()[:8], "big")
    out = ""
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out += _ALNUM[r]
    return out


class MistralFormat(SyntaxFormat, ChatFormat):
    """Templates with ``[TOOL_CALLS]``."""

    object_arguments = True
    preserved = (TOOL_CALLS, "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.named = "[ARGS]" in self.source
        self.with_ids = not self.named or "[CALL_ID]" in self.source
        self.think = MISTRAL_THINK if "[THINK]" in self.source else None
        self.name = "magistral" if self.think else "mistral-v11" if self.named else "mistral-nemo"
        self.tool = SYNTAXES[self.named, self.with_ids]

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        for k, m in enumerate(out):
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {**c, "id": mistral_id(c.get("id"), f"{k}.{j}")} for j, c in enumerate(m["tool_calls"])
                ]
            if m.get("role") == "tool" and "tool_call_id" in m:
                m["tool_call_id"] = mistral_id(m["tool_call_id"])
        return out

    def prepare_call(self, call: dict) -> dict:
        call = super().prepare_call(call)
        if call.get("id"):
            call["id"] = mistral_id(call["id"])
        return call

    def parser_think(self) -> ThinkTags | None:  # (reasoning only where the template has it)
        return self.think

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        parser = super().parser(syntax)
        parser.new_id = lambda: random_id(9, prefix="")
        return parser
