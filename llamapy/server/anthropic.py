"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) over chat completions.

A request becomes a :class:`ChatCompletionRequest` (``system`` -> a system message; ``tool_use`` blocks ->
assistant tool calls; ``tool_result`` blocks -> tool messages; ``tools`` with ``input_schema`` -> chat
function tools; ``tool_choice`` any/tool -> required/named; ``stop_sequences`` -> ``stop``; ``thinking``
-> the template's ``enable_thinking``; ``image`` blocks -> OpenAI ``image_url`` parts: a ``base64`` source
becomes a ``data:`` URL, a ``url`` source is fetched under the same ``--allow-image-urls`` rule) and runs
through the same planning, engine task and token loop as ``/v1/chat/completions``. The parsed message
comes back as content blocks (``thinking``, ``text``, ``tool_use``) and, streamed, as Anthropic's SSE
events. Errors have Anthropic's shape:
``{"type": "error", "error": {"type", "message"}}``.

``thinking.budget_tokens`` is accepted, but there is no separate budget for reasoning: ``max_tokens``
bounds reasoning and answer together.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from .engine import Event, TokenProb
from .errors import APIError, bad_request, not_supported
from .formats import BaseFormatter, new_id
from .inputs import chat_inputs, messages_fit, no_completions, parsed_body
from .inputs import count_tokens as prompt_token_count
from .responses import brief, named_sse, passthrough, validate_at
from .schemas import ChatCompletionRequest, validate
from .stream import generate

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    501: "invalid_request_error",
    503: "overloaded_error",
}


def error_body(e: APIError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    msg = e.message  # (Anthropic's errors have no "param": the message names the field)
    if e.param and e.param not in msg:
        msg = f"{e.param}: {msg}"
    return {"type": "error", "error": {"type": kind, "message": msg}}


# -- request ------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ImageSource(_Body):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Body):
    type: Literal["image"]
    source: ImageSource


class ThinkingBlock(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Body):
    type: Literal["redacted_thinking"]
    data: str | None = None


_USER_BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "image": ImageBlock,
    "tool_result": ToolResultBlock,
}
_ASSISTANT_BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}
_UNSUPPORTED_BLOCKS = ("document", "search_result", "server_tool_use", "web_search_tool_result")


class InputMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Any]


class Tool(_Body):
    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class OutputFormat(_Body):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    effort: str | None = None
    format: OutputFormat | None = None


class CountTokensRequest(_Body):
    model: str | None = None
    messages: list[Any] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Any] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None


def _block(raw: Any, kinds: dict[str, type[BaseModel]], where: str, role: str) -> Any:
    if not isinstance(raw, dict):
        raise bad_request(f"'{where}' must be an object, got {type(raw).__name__}", where)
    kind = raw.get("type")
    if kind in _UNSUPPORTED_BLOCKS:
        raise not_supported(f"content block type {kind!r}", param=f"{where}.type")
    if not isinstance(kind, str) or kind not in kinds:  # (a list or an object is no dict key)
        raise bad_request(
            f"'{where}.type' {brief(kind)} is not a content block of a {role} message ({', '.join(kinds)})",
            f"{where}.type",
        )
    return validate_at(kinds[kind], raw, where)


def _result_text(b: ToolResultBlock, where: str) -> str:
    if b.content is None or isinstance(b.content, str):
        text = b.content or ""
    else:
        parts = []
        for k, p in enumerate(b.content):
            parts.append(_block(p, {"text": TextBlock}, f"{where}.content.{k}", "tool_result").text)
        text = "".join(parts)
    return f"Error: {text}" if b.is_error else text


# Anthropic's image types, and the first bytes of each (a block whose data is another format is refused)
IMAGE_MEDIA_TYPES = {"image/jpeg": (b"\xff\xd8\xff",), "image/png": (b"\x89PNG\r\n\x1a\n",),
                     "image/gif": (b"GIF87a", b"GIF89a"), "image/webp": (b"RIFF",)}  # fmt: skip


def _sniff(data: bytes) -> str | None:
    for mt, magic in IMAGE_MEDIA_TYPES.items():
        if data.startswith(magic) and (mt != "image/webp" or data[8:12] == b"WEBP"):
            return mt
    return None


def image_part(b: ImageBlock, where: str) -> dict[str, Any]:
    """An Anthropic image block as an OpenAI ``image_url`` content part."""
    src = b.source
    if src.type == "url":
        if not isinstance(src.url, str) or not src.url:
            raise bad_request(f"'{where}.source.url' must be a non-empty string", f"{where}.source.url")
        return {"type": "image_url", "image_url": {"url": src.url}}
    mt = src.media_type
    if mt not in IMAGE_MEDIA_TYPES:
        raise bad_request(
            f"'{where}.source.media_type' {mt!r} is not a supported image type "
            f"({', '.join(IMAGE_MEDIA_TYPES)})",
            f"{where}.source.media_type",
        )
    if not isinstance(src.data, str) or not src.data:
        raise bad_request(f"'{where}.source.data' must be a non-empty base64 string", f"{where}.source.data")
    try:
        raw = base64.b64decode(src.data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"'{where}.source.data' is not valid base64: {e}", f"{where}.source.data") from None
    found = _sniff(raw)
    if found is not None and found != mt:
        raise bad_request(
            f"'{where}.source.data' is a {found} image but 'media_type' says {mt}",
            f"{where}.source.media_type",
        )
    return {"type": "image_url", "image_url": {"url": f"data:{mt};base64,{src.data}"}}


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text blocks joined as before; with images, OpenAI content parts (neighbouring texts joined)."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    out: list[dict[str, Any]] = []
    for p in parts:
        if p["type"] == "text" and out and out[-1]["type"] == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + p["text"]}
        else:
            out.append(p)
    return out


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name
    for i, raw in enumerate(req.messages):
        m: InputMessage = validate_at(InputMessage, raw, f"messages.{i}")
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts: list[str] = []
        if m.role == "user":
            parts: list[dict[str, Any]] = []
            for j, rb in enumerate(m.content):
                where = f"messages.{i}.content.{j}"
                b = _block(rb, _USER_BLOCKS, where, "user")
                if isinstance(b, TextBlock):
                    parts.append({"type": "text", "text": b.text})
                    continue
                if isinstance(b, ImageBlock):
                    parts.append(image_part(b, where))
                    continue
                tm: dict[str, Any] = {"role": "tool", "tool_call_id": b.tool_use_id}
                tm["content"] = _result_text(b, where)
                if b.tool_use_id in names:
                    tm["name"] = names[b.tool_use_id]
                out.append(tm)
            if parts:
                out.append({"role": "user", "content": _user_content(parts)})
            continue
        calls, thinking = [], []
        for j, rb in enumerate(m.content):
            b = _block(rb, _ASSISTANT_BLOCKS, f"messages.{i}.content.{j}", "assistant")
            if isinstance(b, TextBlock):
                texts.append(b.text)
            elif isinstance(b, ThinkingBlock):
                thinking.append(b.thinking)
            elif isinstance(b, ToolUseBlock):
                names[b.id] = b.name
                fn = {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}
                calls.append({"id": b.id, "type": "function", "function": fn})
        am: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
        if calls:
            am["tool_calls"] = calls
        if thinking:
            am["reasoning_content"] = "".join(thinking)
        out.append(am)
    return out


def chat_tools(req: CountTokensRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, raw in enumerate(req.tools):
        t: Tool = validate_at(Tool, raw, f"tools.{i}")
        if t.type not in (None, "custom"):
            raise not_supported(
                f"tool type {t.type!r} (only client tools with 'input_schema')", f"tools.{i}.type"
            )
        fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            fn["description"] = t.description
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(tc: ToolChoice | None) -> Any:
    if tc is None:
        return None
    if tc.type == "tool":
        if not tc.name:
            raise bad_request("'tool_choice' of type 'tool' needs a 'name'", "tool_choice.name")
        return {"type": "function", "function": {"name": tc.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[tc.type]


def to_chat(req: CountTokensRequest, raw: dict[str, Any]) -> ChatCompletionRequest:
    chat: dict[str, Any] = {
        "messages": chat_messages(req),
        "tools": chat_tools(req),
        "tool_choice": chat_tool_choice(req.tool_choice),
    }
    if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use:
        chat["parallel_tool_calls"] = False
    if req.thinking is not None and req.thinking.type != "adaptive":
        chat["chat_template_kwargs"] = {"enable_thinking": req.thinking.type == "enabled"}
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:  # structured output: the answer's text is JSON valid against the schema
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.json_schema},
        }
    if isinstance(req, MessagesRequest):
        chat = passthrough(raw) | chat
        chat.update(stream=req.stream, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
        if req.stop_sequences:
            chat["stop"] = req.stop_sequences
    return validate(ChatCompletionRequest, chat)


# -- response -----------------------------------------------------------------------------------------


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


class MessagesFormatter(BaseFormatter):
    """Builds the ``message`` object and, streamed, Anthropic's events (for ``_generate``)."""

    def __init__(self, model: str, n_prompt: int, stop_sequences: list[str]) -> None:
        self.id, self.model, self.n_prompt = new_id("msg"), model, n_prompt
        self.stop_sequences = stop_sequences
        self.index = -1  # the open content block (-1: none)
        self.open_kind = ""  # "text" | "thinking" | "tool_use"
        self.open_call = -1

    encode = staticmethod(named_sse)

    def _stop(self, final: Event) -> tuple[str, str | None]:
        if final.finish_reason == "tool_calls":
            return "tool_use", None
        if final.finish_reason == "length":
            return "max_tokens", None
        if final.stop_type == "word" and final.stopping_word in self.stop_sequences:
            return "stop_sequence", final.stopping_word
        return "end_turn", None

    def _usage(self, final: Event | None) -> dict[str, Any]:
        """Before the end (message_start) the whole prompt; at the end, as Anthropic's API and llama-server
        count: ``input_tokens`` the prompt tokens evaluated, ``cache_read_input_tokens`` the ones reused
        from the slot's cache (their sum is what count_tokens gives)."""
        if final is None:
            return {"input_tokens": self.n_prompt, "output_tokens": 0}
        return {
            "cache_read_input_tokens": final.n_cached,
            "input_tokens": final.n_prompt - final.n_cached,
            "output_tokens": final.n_predicted,
        }

    def _message(self, content: list[dict[str, Any]], final: Event | None) -> dict[str, Any]:
        reason, seq = self._stop(final) if final is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": self._usage(final),
        }

    def response(
        self, text: str, probs: list[TokenProb], final: Event, tokens: list[int] | None = None
    ) -> dict[str, Any]:
        msg = final.message
        blocks: list[dict[str, Any]] = []
        if msg is None:
            blocks.append({"type": "text", "text": text})
        else:
            if msg.reasoning_content:
                blocks.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
            if msg.content or not msg.tool_calls:
                blocks.append({"type": "text", "text": msg.content})
            for c in msg.tool_calls:
                tid = c.id or new_id("toolu")
                blocks.append(
                    {"type": "tool_use", "id": tid, "name": c.name, "input": _tool_input(c.arguments)}
                )
        return self._message(blocks, final)

    # the event stream
    def first_chunk(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self._message([], None)}, {"type": "ping"}]

    def _open(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close()
        self.index += 1
        self.open_kind = kind
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _close(self) -> list[dict[str, Any]]:
        if not self.open_kind:
            return []
        out: list[dict[str, Any]] = []
        if self.open_kind == "thinking":
            delta = {"type": "signature_delta", "signature": ""}
            out.append({"type": "content_block_delta", "index": self.index, "delta": delta})
        self.open_kind, self.open_call = "", -1
        return out + [{"type": "content_block_stop", "index": self.index}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def chunks(self, ev: Event) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in ev.deltas:
            if d.tool_call_index is not None:
                if self.open_kind != "tool_use" or self.open_call != d.tool_call_index:
                    tid = d.tool_call_id or new_id("toolu")
                    block = {"type": "tool_use", "id": tid, "name": d.tool_call_name or "", "input": {}}
                    out += self._open("tool_use", block)
                    self.open_call = d.tool_call_index
                if d.tool_call_arguments:
                    out.append(
                        self._delta({"type": "input_json_delta", "partial_json": d.tool_call_arguments})
                    )
                continue
            if d.reasoning_content:
                if self.open_kind != "thinking":
                    out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning_content}))
            if d.content:
                if self.open_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": d.content}))
        return out

    def final_chunk(self, ev: Event) -> list[dict[str, Any]]:
        out = self._close()
        if self.index < 0:  # nothing was said: one empty text block, as the non-streamed answer has
            out += self._open("text", {"type": "text", "text": ""}) + self._close()
        reason, seq = self._stop(ev)
        usage = self._usage(ev)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": usage,
        }
        return out + [delta, {"type": "message_stop"}]

    def usage_chunk(self, ev: Event) -> None:
        return None

    def error_event(self, e: APIError) -> dict[str, Any]:
        return error_body(e)


def add_routes(app: FastAPI, state: Any) -> None:
    def anthropic_errors(handler: Any) -> Any:
        async def wrapped(request: Request) -> Any:
            try:
                return await handler(request)
            except APIError as e:
                return JSONResponse(error_body(e), status_code=e.status)

        wrapped.__name__ = handler.__name__
        return wrapped

    @app.post("/v1/messages")
    @anthropic_errors
    async def messages(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        no_completions(backend)

        def plan(raw: dict[str, Any]) -> tuple[MessagesRequest, ChatCompletionRequest]:
            messages_fit(raw, engine)
            req: MessagesRequest = validate(MessagesRequest, raw)
            return req, to_chat(req, raw)

        req, chat = await parsed_body(request, plan)
        # max_tokens is required here and agent clients send large ones (32000): an upper bound, clamped
        # to the slot's context by chat_inputs (generation then ends there with stop_reason "max_tokens")
        if req.max_tokens < 1:
            raise bad_request(f"'max_tokens' must be at least 1, got {req.max_tokens}", "max_tokens")
        tokens, gp = await chat_inputs(chat, m, req.max_tokens, "max_tokens")
        fmt = MessagesFormatter(req.model or m.name, len(tokens), req.stop_sequences or [])
        return await generate(request, engine, tokens, gp, fmt, req.stream)

    @app.post("/v1/messages/count_tokens")
    @anthropic_errors
    async def count_tokens(request: Request) -> Any:
        m = await state.pick(request)
        chat = await parsed_body(request, lambda raw: to_chat(validate(CountTokensRequest, raw), raw))
        return {"input_tokens": await prompt_token_count(chat, m)}  # (images count as the tokens they become)
