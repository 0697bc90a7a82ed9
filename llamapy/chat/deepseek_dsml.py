"""DeepSeek V3.2 and V4: DSML calls (``｜DSML｜`` is one token of the vocabulary)

```
<｜DSML｜function_calls>
<｜DSML｜invoke name="get_weather">
<｜DSML｜parameter name="location" string="true">Paris</｜DSML｜parameter>
<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
</｜DSML｜invoke>
</｜DSML｜function_calls>
```

V4 names the block ``tool_calls``. ``string="true"`` values are text, the others JSON (kept as text when
they do not parse). Reasoning: ``<think>``; the prompt opens the block when thinking is on, and a call block also ends it. As
llama.cpp's handler, V4's tool results are put in the order of the calls they answer.
"""

from __future__ import annotations

import json
from typing import Any

import regex

from .common import (
    NOT_A_CALL,
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
    call_triggers,
    expect_tag,
    is_string_schema,
    json_rule,
    lark_str,
    parameter_schemas,
    read_tagged_params,
    reasoning_prefix,
    regex_escape,
    skip_ws,
)
from .reasoning import THINK, partial_suffix

DSML = "｜DSML｜"
_BLOCK = regex.compile(r"<｜DSML｜(function_calls|tool_calls)>")
_INVOKE = regex.compile(r'<｜DSML｜invoke\s+name="([^"]+)"\s*>')
_PARAM = regex.compile(r'<｜DSML｜parameter\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>')
_BLOCK_TAGS = (f"<{DSML}function_calls>", f"<{DSML}tool_calls>")
INVOKE_END, PARAM_END = "</｜DSML｜invoke>", "</｜DSML｜parameter>"


def _value(raw: str, is_string: bool) -> Any:
    if is_string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class DeepSeekDsmlParser(StreamParser):
    """Parser of DSML call blocks."""

    call_start = _BLOCK

    def _step(self, final: bool) -> bool:
        # as llama.cpp, a call block also ends an unclosed reasoning block
        if self._mode == "think" and self.syntax.parse_tool_calls:
            buf = self._buf
            m = _BLOCK.search(buf)
            end = buf.find(THINK.end)
            if m is not None and (end < 0 or m.start() < end):
                self._reasoning(self._strip.push(buf[: m.start()]))
                self._buf, self._mode = buf[m.start() :], "content"
                return True
            if end < 0:
                keep = 0 if final else partial_suffix(buf, THINK.end, *_BLOCK_TAGS)
                self._reasoning(self._strip.push(buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep :]
                return False
        return super()._step(final)

    def parse_call(self, buf: str, final: bool) -> CallParse | None:
        block = _BLOCK.match(buf)
        if block is None:
            return NOT_A_CALL
        close = f"</{DSML}{block.group(1)}>"
        calls: list[ToolCall] = []
        i = block.end()
        while True:
            j = skip_ws(buf, i)
            if buf.startswith(close, j) or (final and j == len(buf) and calls):
                end = expect_tag(buf, j, close, final)
                return CallParse(calls, end) if calls and end is not None and end >= 0 else NOT_A_CALL
            inv = _INVOKE.match(buf, j, partial=not final)
            if inv is None or inv.partial:
                if not final and (inv is not None or close.startswith(buf[j:])):
                    return None
                return NOT_A_CALL
            got = read_tagged_params(
                buf,
                inv.end(),
                final,
                _PARAM,
                PARAM_END,
                INVOKE_END,
                lambda p, raw: _value(raw, p.group(2) != "false"),
            )
            if got is None or got is NOT_A_CALL:
                return got
            args, i = got
            calls.append(ToolCall(inv.group(1), json.dumps(args, ensure_ascii=False)))


def sort_tool_results(messages: list[dict]) -> list[dict]:
    """llama.cpp's ``deepseek_v4_sort_tool_results``: each run of ``tool`` (and ``user``) messages has
    its tool results reordered by the order of the calls (matched by id) of the assistant message
    before it."""
    out = list(messages)
    order: dict[str, int] = {}
    i = 0
    while i < len(out):
        role = out[i].get("role")
        if role == "assistant" and out[i].get("tool_calls"):
            order = {c.get("id"): k for k, c in enumerate(out[i]["tool_calls"]) if c.get("id")}
            i += 1
            continue
        if role not in ("user", "tool"):
            i += 1
            continue
        j = i
        while j < len(out) and out[j].get("role") in ("user", "tool"):
            j += 1
        slots = [k for k in range(i, j) if out[k].get("role") == "tool"]
        if len(slots) > 1 and order:
            results = sorted((out[k] for k in slots), key=lambda m: order.get(m.get("tool_call_id"), 0))
            for k, m in zip(slots, results, strict=True):
                out[k] = m
        i = j
    return out


class DeepSeekDsmlFormat(ChatFormat):
    """Templates with ``dsml_token`` (DeepSeek V3.2: ``function_calls``; V4: ``tool_calls``)."""

    supports_tools = True
    think = THINK
    object_arguments = True
    preserved = (DSML, "<think>", "</think>")

    def __init__(self, source: str | None = None) -> None:
        super().__init__(source)
        self.v4 = "function_calls" not in self.source
        self.name = "deepseek-v4" if self.v4 else "deepseek-v3.2"
        self.block = "tool_calls" if self.v4 else "function_calls"

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[dict]:
        out = super().prepare_messages(messages, tools)
        return sort_tool_results(out) if self.v4 else out

    def build_grammar(self, req: GrammarRequest) -> ToolGrammar:
        def tag(text: str) -> str:  # literal text, the DSML token in it as a token when it is one
            return f" {req.lit(DSML)} ".join(lark_str(p) if p else "" for p in text.split(DSML)).strip()

        ref = req.special(DSML)
        if ref is not None:  # a string value: text up to the first "</", then the token
            rules = [f'str_value: str_body {ref} "parameter>"', r"str_body[lazy]: /(?s:.*)<\//"]
        else:
            rules = [rf"str_value[lazy]: /(?s:.*){regex_escape(PARAM_END)}/"]
        alts = []
        param = tag(f"<{DSML}parameter name=")
        for k, f in enumerate(req.functions):
            kvs = []
            for j, (key, schema) in enumerate(parameter_schemas(f["parameters"])):
                if is_string_schema(schema):
                    kvs.append(param + " " + lark_str('"' + key + '" string="true">') + " str_value")
                else:
                    rules.append(f"f{k}_v{j}: {json_rule(schema)}")
                    head = param + " " + lark_str('"' + key + '" string="false">')
                    kvs.append(f"{head} f{k}_v{j} {tag(PARAM_END)}")
            body = f"((({') | ('.join(kvs)})) {WS})*" if kvs else ""
            head = tag(f"<{DSML}invoke name=") + " " + lark_str('"' + f["name"] + '">\n')
            rules.append(f"f{k}: {head} {body} {tag(INVOKE_END)}")
            alts.append(f"f{k}")
        invoke = f"({' | '.join(alts)})"
        calls = f"{invoke} ({WS} {invoke})*" if req.parallel else invoke
        prefix, extra = reasoning_prefix(req, self.think)
        opening, closing = f"<{DSML}{self.block}>", f"</{DSML}{self.block}>"
        rules = [f"start: {prefix} {tag(opening)} {WS} {calls} {WS} {tag(closing)}", *rules, *extra]
        return ToolGrammar(assemble(rules), call_triggers(req, self.think, opening), self.preserved)

    def parser(self, syntax: ChatSyntax) -> ChatParser:
        return DeepSeekDsmlParser(syntax)
