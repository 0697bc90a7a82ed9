"""ollama's request bodies (``Options`` and the chat, generate, embed and show bodies) and their
translation into the server's own requests (:func:`to_chat`: options -> sampling fields, ``format`` ->
``response_format``, ``think`` -> ``enable_thinking``, images -> ``image_url`` parts, object arguments ->
OpenAI tool calls). The routes are :mod:`.ollama`'s."""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError, bad_request
from .ollama_models import (
    supports_thinking,
)
from .responses import brief, validate_at
from .schemas import ChatCompletionRequest, validate


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class Options(_Body):
    """ollama's runtime options (unknown keys and the load-time ones are ignored, as ollama warns and
    ignores an unknown option); each value must have ollama's type."""

    num_predict: int | None = None
    num_keep: int | None = None
    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    stop: list[str] | str | None = None
    # load-time options: a loaded model keeps its own (accepted, type-checked, ignored)
    num_ctx: int | None = None
    num_batch: int | None = None
    num_thread: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    tfs_z: float | None = None
    penalize_newline: bool | None = None


_SAMPLING = ("seed", "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
             "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau",
             "mirostat_eta")  # fmt: skip

Format = str | dict[str, Any] | None
Think = bool | Literal["low", "medium", "high", "max"] | None
KeepAlive = str | int | float | None


class OMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _GeneratingBody(_Body):
    """The fields /api/chat and /api/generate share."""

    model: str
    format: Format = None
    options: dict[str, Any] | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class ChatBody(_GeneratingBody):
    messages: list[Any] | None = None  # (Go's client sends null for none: a request to load the model)
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_GeneratingBody):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class EmbedBody(_Body):
    model: str
    input: str | list[str] | None = None  # (none or empty: ollama loads the model, answers no vectors)
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsBody(_Body):
    model: str
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ShowBody(_Body):
    model: str | None = None
    name: str | None = None  # (ollama's older field)
    verbose: bool = False


_INT_OPTIONS = {k for k, f in Options.model_fields.items() if f.annotation == int | None}


def _ollama_ints(options: Any) -> Any:
    """ollama reads ``options`` as Go's map[string]any (every JSON number a float64) and truncates a
    number given for an integer option (``"num_predict": 100.0`` is 100)."""
    if not isinstance(options, dict):
        return options
    return {
        k: int(v) if k in _INT_OPTIONS and isinstance(v, float) and math.isfinite(v) else v
        for k, v in options.items()
    }


def _sampling(options: dict[str, Any] | None) -> tuple[dict[str, Any], int | None]:
    """``options`` -> chat/completion request fields, and the token limit (None: the server's default)."""
    if options is None:
        return {}, None
    o: Options = validate_at(Options, _ollama_ints(options), "options")
    out = {k: getattr(o, k) for k in _SAMPLING if getattr(o, k) is not None}
    if o.stop:
        out["stop"] = o.stop
    if o.num_keep is not None:
        out["n_keep"] = o.num_keep
    n = o.num_predict
    return out, (None if n is not None and n < 0 else n)  # -1 (no limit), -2 (fill the context)


def _format(fmt: Format) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt}}
    raise bad_request(f"'format' must be \"json\" or a JSON schema object, got {brief(fmt)}", "format")


def _image_part(data: str, where: str) -> dict[str, Any]:
    from .anthropic import _sniff

    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"'{where}' is not valid base64: {e}", where) from None
    mt = _sniff(raw) or "image/png"
    return {"type": "image_url", "image_url": {"url": f"data:{mt};base64,{data}"}}


def _content(text: str, images: list[str] | None, where: str) -> Any:
    if not images:
        return text
    parts = [_image_part(d, f"{where}.images.{k}") for k, d in enumerate(images)]
    return parts + [{"type": "text", "text": text}]


def _history_call(c: Any, where: str) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f'\'{where}\' must be {{"function": {{"name", "arguments"}}}}', where)
    args = fn.get("arguments", {})
    if not isinstance(args, dict | str):
        raise bad_request(f"'{where}.function.arguments' must be an object", f"{where}.function.arguments")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    out: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": text}}
    if isinstance(c.get("id"), str):
        out["id"] = c["id"]
    return out


def chat_messages(raw: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(raw):
        where = f"messages.{i}"
        if isinstance(r, dict) and isinstance(r.get("role"), str):  # (ollama lowercases the role)
            r = {**r, "role": r["role"].lower()}
        m: OMessage = validate_at(OMessage, r, where)
        msg: dict[str, Any] = {"role": m.role, "content": _content(m.content or "", m.images, where)}
        if m.tool_call_id and m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
        if m.thinking and m.role == "assistant":
            msg["reasoning_content"] = m.thinking
        if m.tool_calls:
            msg["tool_calls"] = [
                _history_call(c, f"{where}.tool_calls.{j}") for j, c in enumerate(m.tool_calls)
            ]
            if not m.content:
                msg["content"] = None
        if m.tool_name and m.role == "tool":
            msg["name"] = m.tool_name
        out.append(msg)
    return out


def _think(think: Think, template: str) -> dict[str, Any] | None:
    if think is None:
        return None
    if think is not False and not supports_thinking(template):
        raise bad_request(
            "this model does not support thinking (its chat template has no thinking switch)", "think"
        )
    kw: dict[str, Any] = {"enable_thinking": think is not False}
    if isinstance(think, str):  # (ollama: "max" is "high" where a template knows only low/medium/high)
        kw["reasoning_effort"] = "high" if think == "max" else think
    return kw


def to_chat(
    messages: list[dict[str, Any]], body: ChatBody | GenerateBody, tools: Any, template: str
) -> tuple[ChatCompletionRequest, int | None]:
    fields, n_predict = _sampling(body.options)
    chat: dict[str, Any] = {"messages": messages, "stream": body.stream, **fields}
    if body.logprobs:
        chat.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    elif body.top_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    if tools:
        chat["tools"] = tools
    rf = _format(body.format)
    if rf is not None:
        chat["response_format"] = rf
    kw = _think(body.think, template)
    if kw is not None:
        chat["chat_template_kwargs"] = kw
    if not messages:
        raise bad_request("'messages' must not be empty", "messages")
    return _validate_with_options(ChatCompletionRequest, chat, fields), n_predict


def _validate_with_options(model: type[BaseModel], body: dict[str, Any], fields: dict[str, Any]) -> Any:
    """``validate``; an error in a value that came from ``options`` names it there (``options.top_p``)."""
    try:
        return validate(model, body)
    except APIError as e:
        if e.param not in fields:
            raise
        opt = "num_keep" if e.param == "n_keep" else e.param
        msg = e.message.replace(f"'{e.param}'", f"'options.{opt}'", 1)
        raise APIError(e.status, msg, param=f"options.{opt}") from None


# -- response -----------------------------------------------------------------------------------------
