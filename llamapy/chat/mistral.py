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

import regex

from .common import (
    NOT_A_CALL,
    PARTIAL,
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
    call_triggers,
    dump_arguments,
    json_rule,
    lark_str,
    one_of,
    random_id,
    read_json,
    reasoning_prefix,
    skip_ws,
)
from .reasoning import MISTRAL_THINK, ThinkTags

TOOL_CALLS = "[TOOL_CALLS]"
_START = regex.compile(regex.escape(TOOL_CALLS))
_NAMED = regex.compile(r"\s*([^\[\]\s{}]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9]+)\s*)?\[ARGS\]")
_ID = re.compile(r"[A-Za-z0-9]{9}")
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


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


class MistralParser(StreamParser):
    """Parser of both Mistral syntaxes."""

    call_start = _START

    def __init__(self, syntax: ChatSyntax, think: ThinkTags | None = None) -> None:
        self.think = think
        super().__init__(syntax)
        self.new_id = lambda: random_id(9, prefix="")

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        i = skip_ws(buf, len(TOOL_CALLS))
        if i >= len(buf):
            return None if not final else NOT_A_CALL
        if buf[i] == "[":
            got = read_json(buf, i, self.json_cache)
            if got is PARTIAL:
                return None
            if got is None:
                return NOT_A_CALL
            value, end = got
            calls = [call_from_object(v) for v in value] if isinstance(value, list) else [None]
            if not calls or any(c is None for c in calls):
                return NOT_A_CALL
            return CallParse(calls, end)
        m = _NAMED.match(buf, len(TOOL_CALLS), partial=not final)
        if m is None:
            return NOT_A_CALL
        if m.partial:
            return None
        got = read_json(buf, m.end(), self.json_cache)
        if got is PARTIAL:
            return None
        if got is None or not isinstance(got[0], dict):
            return NOT_A_CALL
        value, end = got
        return CallParse([ToolCall(m.group(1), dump_arguments(value), m.group(2) or "")], end)


class MistralFormat(ChatFormat):
    """Templates with ``[TOOL_CALLS]``."""

    supports_tools = True
    object_arguments = True
    preserved = (TOOL_CALLS, "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.named = "[ARGS]" in self.source
        self.with_ids = not self.named or "[CALL_ID]" in self.source
        self.think = MISTRAL_THINK if "[THINK]" in self.source else None
        self.name = "magistral" if self.think else "mistral-v11" if self.named else "mistral-nemo"

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

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        tag = req.lit(TOOL_CALLS)
        if self.named:
            alts, rules = [], []
            for k, f in enumerate(req.functions):
                call_id = f" {req.lit('[CALL_ID]')} /[a-zA-Z0-9]{{9}}/" if self.with_ids else ""
                rules.append(f"f{k}_args: {json_rule(f['parameters'])}")
                alts.append(f"{lark_str(f['name'])}{call_id} {req.lit('[ARGS]')} f{k}_args")
            rules.insert(0, f"call: {tag} ({' | '.join(alts)})")
        else:
            schema = {
                "type": "array",
                "items": one_of(
                    [
                        {
                            "type": "object",
                            "properties": {
                                "name": {"const": f["name"]},
                                "arguments": f["parameters"],
                                "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"},
                            },
                            "required": ["name", "arguments", "id"],
                            "additionalProperties": False,
                        }
                        for f in req.functions
                    ]
                ),
                "minItems": 1,
            }
            if not req.parallel:
                schema["maxItems"] = 1
            rules = [f"call: {tag} {json_rule(schema)}"]
        calls = req.calls("call") if self.named else "call"
        prefix, extra = reasoning_prefix(req, self.think)
        rules = [f"start: {prefix} {calls}", *rules, *extra]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, TOOL_CALLS), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return MistralParser(syntax, self.think)
