"""OpenAI's Responses API (``POST /v1/responses``) as a translation over chat completions.

A request becomes a :class:`ChatCompletionRequest` (``input`` items -> chat messages, flat function tools
-> chat tools, ``text.format`` -> ``response_format``, ``max_output_tokens`` -> ``max_tokens``) and runs
through the same planning, engine task and token loop as ``/v1/chat/completions``; the chat deltas and
the parsed message come back as Responses output items (``reasoning``, ``message``, ``function_call``)
and, streamed, as the Responses event stream. Conversations are kept in memory for the last
:data:`MAX_STORED` stored responses (and at most :data:`MAX_STORED_BYTES` of them, estimated), for
``previous_response_id``; with API keys, a stored response belongs to the key that made it (another key
is answered as if it did not exist).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from .engine import Event, TokenProb
from .errors import APIError, bad_request, not_supported
from .formats import BaseFormatter, new_id, progress_json
from .guard import request_key_id
from .inputs import chat_inputs, count_tokens, no_completions, parsed_body
from .schemas import ChatCompletionRequest, SamplingFields, validate
from .stream import generate

MAX_STORED = 256  # responses kept for previous_response_id
MAX_STORED_BYTES = 256 << 20  # and their estimated memory (approx_size), all together
# OpenAI's metadata: at most 16 pairs, keys strings of at most 64 characters, values of at most 512
METADATA_MAX_PAIRS, METADATA_MAX_KEY, METADATA_MAX_VALUE = 16, 64, 512
# llama.cpp sampling extras a client may add to the body (top_k, min_p, seed, ...), passed to chat as-is
_NOT_PASSED = {"model", "stream", "stream_options", "user", "temperature", "top_p"}
PASSTHROUGH = tuple(k for k in SamplingFields.model_fields if k not in _NOT_PASSED)


def named_sse(obj: dict[str, Any]) -> bytes:
    """``event: <type>`` + ``data: <json>``: the SSE form of the Responses and Messages streams."""
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"event: {obj['type']}\ndata: {data}\n\n".encode()


def passthrough(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: raw[k] for k in PASSTHROUGH if k in raw}


def brief(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile value must not be echoed whole)."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def validate_at(model: type[BaseModel], obj: Any, where: str) -> Any:
    """:func:`validate` for a nested object: the error names the field under ``where``."""
    if not isinstance(obj, dict):
        raise bad_request(f"'{where}' must be an object, got {type(obj).__name__}", where)
    try:
        return validate(model, obj)
    except APIError as e:
        param = f"{where}.{e.param}" if e.param and e.param != "body" else where
        raise APIError(400, e.message.replace(f"'{e.param}'", f"'{param}'", 1), param=param) from None


# -- request ------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class FunctionTool(_Body):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(_Body):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningOptions(_Body):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    reasoning: ReasoningOptions | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    top_logprobs: int | None = None
    background: bool | None = None


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]


class ReasoningItem(_Body):
    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None


_ITEMS: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _parts_text(parts: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(parts, str):
        return parts
    out = []
    for j, p in enumerate(parts):
        kind = p.get("type")
        if kind == "refusal" and isinstance(p.get("refusal"), str):
            out.append(p["refusal"])
            continue
        if not isinstance(kind, str) or kind not in _TEXT_PARTS:
            if kind in ("input_image", "input_file", "input_audio"):
                raise not_supported(f"content part type {kind!r}", param=f"{where}.{j}.type")
            raise bad_request(
                f"'{where}.{j}.type' {brief(kind)} is not one of input_text, output_text", f"{where}.{j}.type"
            )
        if not isinstance(p.get("text"), str):
            raise bad_request(f"'{where}.{j}' has type {kind!r} but no 'text' string", f"{where}.{j}.text")
        out.append(p["text"])
    return "".join(out)


def input_messages(items: str | list[Any], known_calls: dict[str, str]) -> list[dict[str, Any]]:
    """Responses ``input`` -> chat messages (``known_calls``: call_id -> function name, updated)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    msgs: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, raw in enumerate(items):
        where = f"input.{i}"
        if not isinstance(raw, dict):
            raise bad_request(f"'{where}' must be an object, got {type(raw).__name__}", where)
        kind = raw.get("type", "message" if "role" in raw else None)
        if not isinstance(kind, str) or kind not in _ITEMS:  # (a list or an object is no dict key)
            raise bad_request(
                f"'{where}.type' {brief(kind)} is not one of {', '.join(_ITEMS)}"
                + (" (other item types are not supported)" if isinstance(kind, str) else ""),
                f"{where}.type",
            )
        item = validate_at(_ITEMS[kind], raw, where)
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            m: dict[str, Any] = {"role": role, "content": _parts_text(item.content, f"{where}.content")}
            if role == "assistant" and reasoning:
                m["reasoning_content"], reasoning = "".join(reasoning), []
            msgs.append(m)
        elif isinstance(item, FunctionCallItem):
            known_calls[item.call_id] = item.name
            last = msgs[-1] if msgs else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                msgs.append(last)
            if reasoning:
                last["reasoning_content"], reasoning = "".join(reasoning), []
            call = {"name": item.name, "arguments": item.arguments}
            last.setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": call}
            )
        elif isinstance(item, FunctionCallOutputItem):
            m = {"role": "tool", "tool_call_id": item.call_id}
            m["content"] = _parts_text(item.output, f"{where}.output")
            if item.call_id in known_calls:
                m["name"] = known_calls[item.call_id]
            msgs.append(m)
        else:
            parts = item.content if item.content else item.summary
            reasoning.append(_parts_text(parts, f"{where}.summary"))
    return msgs


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise not_supported(f"tool type {brief(kind)} (only 'function' tools)", param=f"tools.{i}.type")
        ft: FunctionTool = validate_at(FunctionTool, t, f"tools.{i}")
        fn: dict[str, Any] = {"name": ft.name, "parameters": ft.parameters or {"type": "object"}}
        if ft.description is not None:
            fn["description"] = ft.description
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(tc: str | dict[str, Any] | None) -> Any:
    if tc is None or isinstance(tc, str):
        return tc
    if tc.get("type") == "function" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}
    raise bad_request(
        '\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "name": ...}',
        "tool_choice",
    )


def response_format(text: TextOptions | None) -> dict[str, Any] | None:
    f = text.format if text is not None else None
    if f is None or f.type == "text":
        return None
    if f.type == "json_object":
        return {"type": "json_object"}
    if not isinstance(f.json_schema, dict | bool):
        raise bad_request("'text.format' of type json_schema needs a 'schema'", "text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": f.name or "schema", "schema": f.json_schema}}


def to_chat(
    req: ResponsesRequest, raw: dict[str, Any], history: list[dict[str, Any]]
) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """The chat request of a Responses request, and the conversation to store (without instructions)."""
    if req.top_logprobs:
        raise not_supported("'top_logprobs' on /v1/responses", param="top_logprobs")
    if req.background:
        raise not_supported("'background' responses", param="background")
    known: dict[str, str] = {}
    for m in history:
        for c in m.get("tool_calls") or []:
            known[c["id"]] = c["function"]["name"]
    conversation = history + input_messages(req.input, known)
    if not any(m["role"] != "system" for m in conversation):
        raise bad_request("'input' has no messages", "input")
    msgs = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    chat: dict[str, Any] = passthrough(raw) | {
        "messages": msgs,
        "stream": req.stream,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format(req.text),
        "temperature": req.temperature,
        "top_p": req.top_p,
    }
    kwargs = raw.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_request(
            f"invalid field 'chat_template_kwargs': must be an object, got {type(kwargs).__name__}",
            "chat_template_kwargs",
        )
    if req.reasoning is not None and req.reasoning.effort is not None:  # as llama-server: "none" is off
        chat["reasoning_effort"] = req.reasoning.effort
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    return validate(ChatCompletionRequest, chat), conversation


def check_metadata(meta: Any) -> None:
    """OpenAI's bounds on ``metadata``: an object of at most 16 pairs, keys of at most 64 characters,
    string values of at most 512 (checked before the body is validated: a flood of pairs stops here)."""
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise bad_request(
            f"invalid field 'metadata': must be an object of string values, got {type(meta).__name__}",
            "metadata",
        )
    if len(meta) > METADATA_MAX_PAIRS:
        raise bad_request(
            f"invalid field 'metadata': {len(meta)} pairs, the limit is {METADATA_MAX_PAIRS}", "metadata"
        )
    for k, v in meta.items():
        if len(k) > METADATA_MAX_KEY:
            raise bad_request(
                f"invalid field 'metadata': the key {brief(k)} has {len(k)} characters, "
                f"the limit is {METADATA_MAX_KEY}",
                "metadata",
            )
        if not isinstance(v, str):
            raise bad_request(
                f"invalid field 'metadata.{k}': must be a string, got {type(v).__name__}", f"metadata.{k}"
            )
        if len(v) > METADATA_MAX_VALUE:
            raise bad_request(
                f"invalid field 'metadata.{k}': {len(v)} characters, the limit is {METADATA_MAX_VALUE}",
                f"metadata.{k}",
            )


def approx_size(obj: Any) -> int:
    """An estimate of the memory a parsed JSON value holds, in bytes, from above (about 1x for long
    strings, up to ~10x for lists of small numbers): its ASCII JSON text's length plus a small Python
    object's size per value, object and array. Computed by C code (``json.dumps``, ``str.count``):
    milliseconds for a body of megabytes."""
    text = json.dumps(obj, separators=(",", ":"), default=str)
    n_values = 1 + text.count(",") + text.count(":")
    return len(text) + _PER_VALUE * n_values + _PER_OBJECT * text.count("{") + _PER_LIST * text.count("[")


_PER_VALUE, _PER_OBJECT, _PER_LIST = 72, 160, 64  # (a dict of one key is 184 bytes, a list 56 + 8 a slot)


class _Stored:
    __slots__ = ("conversation", "body", "owner", "n_bytes")

    def __init__(self, conversation: list[dict[str, Any]], body: dict[str, Any], owner: str | None) -> None:
        self.conversation, self.body, self.owner = conversation, body, owner
        self.n_bytes = approx_size(conversation) + approx_size(body)


class ResponseStore:
    """The last ``size`` stored responses, each with its conversation and the API key it belongs to, at
    most ``max_bytes`` of them all together (by :func:`approx_size`; least recent dropped first; one
    larger than the whole budget is not kept). Thread-safe.

    ``owner`` is the API key a request was authorized with (a digest, see :func:`guard.key_id`; None
    when the server has no keys): a response is found only by the key that made it, and for any other
    key it is answered exactly as an id that does not exist."""

    def __init__(self, size: int = MAX_STORED, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.n_bytes = 0
        self._items: OrderedDict[str, _Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(
        self,
        response_id: str,
        conversation: list[dict[str, Any]],
        body: dict[str, Any],
        owner: str | None = None,
    ) -> None:
        item = _Stored(conversation, body, owner)  # (measured outside the lock)
        with self._lock:
            if item.n_bytes > self.max_bytes:  # never kept: the others stay
                return
            old = self._items.pop(response_id, None)
            if old is not None:
                self.n_bytes -= old.n_bytes
            self._items[response_id] = item
            self.n_bytes += item.n_bytes
            while self._items and (len(self._items) > self.size or self.n_bytes > self.max_bytes):
                _, dropped = self._items.popitem(last=False)
                self.n_bytes -= dropped.n_bytes

    def has(self, response_id: str) -> bool:
        with self._lock:
            return response_id in self._items

    def _find(self, response_id: str, owner: str | None, status: int, param: str | None) -> _Stored:
        with self._lock:
            found = self._items.get(response_id)
            if found is not None and found.owner != owner:
                found = None  # another key's: as if it did not exist
            if found is not None:
                self._items.move_to_end(response_id)
        if found is None:
            what = "previous response" if param else "response"
            raise APIError(
                status,
                f"{what} with id {brief(response_id, 100)} not found (this server keeps the last "
                f"{self.size} stored responses, up to {self.max_bytes >> 20} MiB, in memory)",
                param=param,
            )
        return found

    def get(self, response_id: str, owner: str | None = None) -> list[dict[str, Any]]:
        """The conversation up to and including ``response_id`` (for ``previous_response_id``: 400)."""
        return [dict(m) for m in self._find(response_id, owner, 400, "previous_response_id").conversation]

    def response(self, response_id: str, owner: str | None = None) -> dict[str, Any]:
        """The stored response object (``GET /v1/responses/{id}``: 404)."""
        return self._find(response_id, owner, 404, None).body

    def delete(self, response_id: str, owner: str | None = None) -> None:
        self._find(response_id, owner, 404, None)
        with self._lock:
            dropped = self._items.pop(response_id, None)
            if dropped is not None:
                self.n_bytes -= dropped.n_bytes


# -- response -----------------------------------------------------------------------------------------


class ResponsesFormatter(BaseFormatter):
    """Builds the ``response`` object and, streamed, the Responses events (for ``_generate``)."""

    def __init__(
        self,
        model: str,
        req: ResponsesRequest,
        raw: dict[str, Any],
        conversation: list[dict[str, Any]],
        on_done: Callable[[str, list[dict[str, Any]], dict[str, Any]], None] | None,
    ) -> None:
        self.id, self.created, self.model = new_id("resp"), int(time.time()), model
        self.req, self.raw = req, raw
        self.conversation, self.on_done = conversation, on_done
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # output items, in order
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.open_call = -1  # tool_call_index of the open function_call item
        self.started = False  # response.created was sent

    encode = staticmethod(named_sse)

    # the response object
    def _object(self, status: str, final: Event | None) -> dict[str, Any]:
        r, raw = self.req, self.raw
        fmt = raw.get("text", {}).get("format") if isinstance(raw.get("text"), dict) else None
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": [dict(i) for i in self.items] if final is not None else [],
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": r.reasoning.effort, "summary": r.reasoning.summary}
            if r.reasoning
            else None,
            "store": r.store,
            "temperature": r.temperature,
            "text": {"format": fmt or {"type": "text"}},
            "tool_choice": raw.get("tool_choice", "auto"),
            "tools": raw.get("tools") or [],
            "top_p": r.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": r.user,
            "metadata": r.metadata or {},
        }
        if final is not None:
            if final.finish_reason == "length":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["usage"] = {
                "input_tokens": final.n_prompt,
                "input_tokens_details": {"cached_tokens": final.n_cached},
                "output_tokens": final.n_predicted,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": final.n_prompt + final.n_predicted,
            }
        return body

    def _finish(self, final: Event) -> dict[str, Any]:
        status = "incomplete" if final.finish_reason == "length" else "completed"
        for item in self.items:  # (tool calls are parsed whole: only text can be cut short)
            item["status"] = status if item["type"] == "message" else "completed"
        body = self._object(status, final)
        if self.on_done is not None and self.req.store:
            self.on_done(self.id, self.conversation + [self._assistant_message()], body)
        return body

    def _assistant_message(self) -> dict[str, Any]:
        text = "".join(p["text"] for i in self.items if i["type"] == "message" for p in i["content"])
        reasoning = "".join(s["text"] for i in self.items if i["type"] == "reasoning" for s in i["summary"])
        calls = [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in self.items
            if i["type"] == "function_call"
        ]
        m: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if reasoning:
            m["reasoning_content"] = reasoning
        if calls:
            m["tool_calls"] = calls
        return m

    @staticmethod
    def _reasoning_item(text: str = "") -> dict[str, Any]:
        return {"id": new_id("rs"), "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}

    @staticmethod
    def _message_item(text: str = "") -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "id": new_id("msg"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [part],
        }

    @staticmethod
    def _call_item(call_id: str, name: str, arguments: str = "") -> dict[str, Any]:
        return {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id or new_id("call"),
            "name": name,
            "arguments": arguments,
        }

    def response(
        self, text: str, probs: list[TokenProb], final: Event, tokens: list[int] | None = None
    ) -> dict[str, Any]:
        msg = final.message
        if msg is None:
            self.items.append(self._message_item(text))
        else:
            if msg.reasoning_content:
                self.items.append(self._reasoning_item(msg.reasoning_content))
            if msg.content or not msg.tool_calls:
                self.items.append(self._message_item(msg.content))
            for c in msg.tool_calls:
                self.items.append(self._call_item(c.id, c.name, c.arguments))
        return self._finish(final)

    # the event stream
    def _ev(self, type: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def first_chunk(self) -> list[dict[str, Any]]:
        if self.started:  # (a progress event opened the stream)
            return []
        self.started = True
        obj = self._object("in_progress", None)
        return [self._ev("response.created", response=obj), self._ev("response.in_progress", response=obj)]

    def progress_chunk(self, ev: Event) -> list[dict[str, Any]]:
        """llama-server's: the first progress event opens the stream (response.created and .in_progress),
        the others are a response.in_progress; the last event carries ``prompt_progress``."""
        out = self.first_chunk() or [
            self._ev("response.in_progress", response=self._object("in_progress", None))
        ]
        out[-1]["prompt_progress"] = progress_json(ev)
        return out

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self.open = item
        n = len(self.items) - 1
        shown = dict(item)
        out = []
        if item["type"] == "reasoning":
            shown["summary"] = []
            out.append(self._ev("response.output_item.added", output_index=n, item=shown))
            part = {"type": "summary_text", "text": ""}
            out.append(
                self._ev(
                    "response.reasoning_summary_part.added",
                    item_id=item["id"],
                    output_index=n,
                    summary_index=0,
                    part=part,
                )
            )
        elif item["type"] == "message":
            shown["content"] = []
            out.append(self._ev("response.output_item.added", output_index=n, item=shown))
            part = dict(item["content"][0])
            out.append(
                self._ev(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    part=part,
                )
            )
        else:
            shown["arguments"] = ""
            out.append(self._ev("response.output_item.added", output_index=n, item=shown))
        return out

    def _close(self) -> list[dict[str, Any]]:
        item, self.open, self.open_call = self.open, None, -1
        if item is None:
            return []
        n, iid = len(self.items) - 1, item["id"]
        out = []
        if item["type"] == "reasoning":
            part = item["summary"][0]
            out.append(
                self._ev(
                    "response.reasoning_summary_text.done",
                    item_id=iid,
                    output_index=n,
                    summary_index=0,
                    text=part["text"],
                )
            )
            out.append(
                self._ev(
                    "response.reasoning_summary_part.done",
                    item_id=iid,
                    output_index=n,
                    summary_index=0,
                    part=dict(part),
                )
            )
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(
                self._ev(
                    "response.output_text.done",
                    item_id=iid,
                    output_index=n,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            out.append(
                self._ev(
                    "response.content_part.done",
                    item_id=iid,
                    output_index=n,
                    content_index=0,
                    part=dict(part),
                )
            )
        else:
            out.append(
                self._ev(
                    "response.function_call_arguments.done",
                    item_id=iid,
                    output_index=n,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        item["status"] = "completed"
        out.append(self._ev("response.output_item.done", output_index=n, item=dict(item)))
        return out

    def chunks(self, ev: Event) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in ev.deltas:
            open_type = self.open["type"] if self.open is not None else None
            if d.tool_call_index is not None:
                if open_type != "function_call" or self.open_call != d.tool_call_index:
                    out += self._close()
                    out += self._open(self._call_item(d.tool_call_id or "", d.tool_call_name or ""))
                    self.open_call = d.tool_call_index
                assert self.open is not None
                if d.tool_call_arguments:
                    self.open["arguments"] += d.tool_call_arguments
                    out.append(
                        self._ev(
                            "response.function_call_arguments.delta",
                            item_id=self.open["id"],
                            output_index=len(self.items) - 1,
                            delta=d.tool_call_arguments,
                        )
                    )
                continue
            if d.reasoning_content:
                if open_type != "reasoning":
                    out += self._close()
                    out += self._open(self._reasoning_item())
                assert self.open is not None
                self.open["summary"][0]["text"] += d.reasoning_content
                out.append(
                    self._ev(
                        "response.reasoning_summary_text.delta",
                        item_id=self.open["id"],
                        output_index=len(self.items) - 1,
                        summary_index=0,
                        delta=d.reasoning_content,
                    )
                )
            if d.content:
                if self.open is None or self.open["type"] != "message":
                    out += self._close()
                    out += self._open(self._message_item())
                self.open["content"][0]["text"] += d.content
                out.append(
                    self._ev(
                        "response.output_text.delta",
                        item_id=self.open["id"],
                        output_index=len(self.items) - 1,
                        content_index=0,
                        delta=d.content,
                        logprobs=[],
                    )
                )
        return out

    def final_chunk(self, ev: Event) -> list[dict[str, Any]]:
        out = self._close()
        if not self.items:  # nothing was said: one empty message, as the non-streamed answer has
            out += self._open(self._message_item())
            out += self._close()
        body = self._finish(ev)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return out + [self._ev(kind, response=body)]

    def usage_chunk(self, ev: Event) -> None:
        return None

    def error_event(self, e: APIError) -> dict[str, Any]:
        return self._ev("error", code=str(e.status), message=e.message, param=e.param)


def add_routes(app: FastAPI, state: Any) -> None:
    store = ResponseStore()
    state.response_store = store  # (for tests and introspection)

    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses(request: Request) -> Any:
        m = await state.pick(request)
        engine, backend = m.ready()
        no_completions(backend)
        owner = request_key_id(request.scope)

        def plan(raw: dict[str, Any]) -> tuple[dict[str, Any], ResponsesRequest, Any, list[dict[str, Any]]]:
            check_metadata(raw.get("metadata"))
            req: ResponsesRequest = validate(ResponsesRequest, raw)
            history = store.get(req.previous_response_id, owner) if req.previous_response_id else []
            return raw, req, *to_chat(req, raw, history)

        raw, req, chat, conversation = await parsed_body(request, plan)
        if req.max_output_tokens is not None and req.max_output_tokens < 1:  # (no -1 in this API)
            raise bad_request(
                f"'max_output_tokens' must be at least 1, got {req.max_output_tokens}", "max_output_tokens"
            )
        tokens, gp = await chat_inputs(chat, m, req.max_output_tokens, "max_output_tokens")
        keep = functools.partial(store.put, owner=owner)
        fmt = ResponsesFormatter(m.name, req, raw, conversation, keep)
        return await generate(request, engine, tokens, gp, fmt, req.stream)

    @app.post("/v1/responses/input_tokens")
    @app.post("/responses/input_tokens")
    async def responses_input_tokens(request: Request) -> dict[str, Any]:
        """llama-server's token count of a Responses request (its prompt as the chat template renders it)."""
        m = await state.pick(request)
        owner = request_key_id(request.scope)

        def plan(raw: dict[str, Any]) -> ChatCompletionRequest:
            req: ResponsesRequest = validate(ResponsesRequest, raw)
            history = store.get(req.previous_response_id, owner) if req.previous_response_id else []
            return to_chat(req, raw, history)[0]

        chat = await parsed_body(request, plan)
        return {"input_tokens": await count_tokens(chat, m), "object": "response.input_tokens"}

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> Any:
        return store.response(response_id, request_key_id(request.scope))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> Any:
        store.delete(response_id, request_key_id(request.scope))
        return {"id": response_id, "object": "response", "deleted": True}
