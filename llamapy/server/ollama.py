"""ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/tags``...) over the server's models.

A thin translation, as :mod:`llamapy.server.anthropic` is: a chat request becomes a
:class:`ChatCompletionRequest` (``options`` -> sampling fields, ``format`` -> ``response_format``, ``think``
-> the template's ``enable_thinking``, ``images`` -> OpenAI ``image_url`` parts, ``message.tool_calls``
with object arguments -> OpenAI tool calls) and runs through the same planning, engine task and token loop
as ``/v1/chat/completions``; ``/api/generate`` is a one-message chat, or with ``raw`` / ``suffix`` the
``/v1/completions`` path (the prompt as it is; fill-in-the-middle). Answers use ollama's field names, its
newline-delimited JSON stream (``stream`` defaults to true, as ollama's) and its final statistics; errors
are ``{"error": "message"}`` with the HTTP status.

On a one-model server ``model`` must name the served model (its alias or file name, ``:latest``
optional; anything else is a 404 that names it) and ``keep_alive`` is ignored (the model stays loaded);
``/api/pull``, ``/api/delete``, ``/api/copy`` answer 501. In router mode (:mod:`.router`) ``model`` picks
the model, ``keep_alive`` sets how long it stays loaded after the request, and pull, copy and delete
manage the router's list. Load-time options (``num_ctx``, ``num_thread``, ``num_gpu``, ``num_batch``...)
cannot change a loaded model: they are accepted and ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from . import params as P
from .embeddings import run_embeddings, tokens_of
from .errors import APIError, bad_request, not_supported
from .formats import BaseFormatter
from .infill import suffix_tokens
from .inputs import chat_inputs, messages_fit, no_completions, parsed_body
from .responses import brief, validate_at
from .schemas import ChatCompletionRequest, CompletionRequest, validate
from .stream import generate

PREFIX = "/api/"  # errors under it get ollama's shape
VERSION = "0.12.0"  # the ollama API version this imitates (some apps check it)
MAX_INPUTS = 2048  # embedding inputs of one request (each is an engine task)


def error_body(e: APIError) -> dict[str, Any]:
    msg = e.message
    if e.param and e.param != "body" and e.param not in msg:
        msg = f"{e.param}: {msg}"
    return {"error": msg}


def ndjson(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# -- request ------------------------------------------------------------------------------------------


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
Think = bool | Literal["low", "medium", "high"] | None
KeepAlive = str | int | float | None


class OMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


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
    messages: list[Any] = Field(default_factory=list)
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
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsBody(_Body):
    model: str
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ShowBody(_Body):
    model: str | None = None
    name: str | None = None  # (ollama's older field)
    verbose: bool = False


def _sampling(options: dict[str, Any] | None) -> tuple[dict[str, Any], int | None]:
    """``options`` -> chat/completion request fields, and the token limit (None: the server's default)."""
    if options is None:
        return {}, None
    o: Options = validate_at(Options, options, "options")
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
        m: OMessage = validate_at(OMessage, r, where)
        msg: dict[str, Any] = {"role": m.role, "content": _content(m.content or "", m.images, where)}
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
    if isinstance(think, str):
        kw["reasoning_effort"] = think
    return kw


def supports_thinking(template: str) -> bool:
    return any(k in template for k in ("enable_thinking", "<think>", "reasoning_content", "thinking"))


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


def _tok(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def _done_reason(ev: Any) -> str:
    return "length" if ev.finish_reason == "length" else "stop"


def _arguments(text: str) -> dict[str, Any]:
    try:
        v = json.loads(text) if text else {}
    except ValueError:
        return {"arguments": text}
    return v if isinstance(v, dict) else {"value": v}


def load_ns(request: Request) -> int:
    """Nanoseconds this request waited for its model to load (router mode; 0 when it was loaded)."""
    return int(request.scope.get("llamapy.load_seconds", 0.0) * 1e9)


class OllamaFormatter(BaseFormatter):
    """ollama's answer objects and NDJSON stream (for ``_generate``): ``kind`` "chat" or "generate"."""

    encode = staticmethod(ndjson)
    media_type = "application/x-ndjson"

    def __init__(self, model: str, kind: str, t0: float, logprobs: bool = False) -> None:
        self.model, self.kind, self.t0, self.logprobs = model, kind, t0, logprobs
        self.load_ns = 0
        self.calls: dict[int, list[str]] = {}  # streamed tool calls by index: [name, arguments]

    def _piece(self, content: str, thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict:
        out: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.kind == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            out["message"] = msg
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return out

    def _stats(self, out: dict[str, Any], ev: Any) -> dict[str, Any]:
        out.update(
            done=True,
            done_reason=_done_reason(ev),
            total_duration=int((time.perf_counter() - self.t0) * 1e9),
            load_duration=self.load_ns,  # (router mode: the wait for this request's model to load)
            prompt_eval_count=ev.n_prompt,
            prompt_eval_duration=int(ev.prompt_ms * 1e6),
            eval_count=ev.n_predicted,
            eval_duration=int(ev.predicted_ms * 1e6),
        )
        return out

    @staticmethod
    def _calls(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [
            {"function": {"index": i, "name": name, "arguments": _arguments(args)}}
            for i, (name, args) in enumerate(pairs)
        ]

    def first_chunk(self) -> None:
        return None

    def _with_probs(self, out: dict[str, Any], probs: list[Any]) -> dict[str, Any]:
        if self.logprobs:
            out["logprobs"] = [
                {"token": _tok(p.piece), "logprob": p.logprob,
                 "top_logprobs": [{"token": _tok(b), "logprob": lp} for _, b, lp in p.top]}
                for p in probs
            ]  # fmt: skip
        return out

    def chunks(self, ev: Any) -> list[dict[str, Any]]:
        pieces = self._chunks(ev)
        if self.logprobs and ev.probs:
            pieces = pieces or [self._piece("")]
            self._with_probs(pieces[0], ev.probs)
        return pieces

    def _chunks(self, ev: Any) -> list[dict[str, Any]]:
        if not ev.deltas:
            return [self._piece(ev.text)] if ev.text and self.kind == "generate" else []
        content, thinking = [], []
        for d in ev.deltas:
            if d.tool_call_index is not None:  # ollama sends each call whole: kept until the end
                call = self.calls.setdefault(d.tool_call_index, ["", ""])
                call[0] += d.tool_call_name or ""
                call[1] += d.tool_call_arguments
                continue
            content.append(d.content)
            thinking.append(d.reasoning_content)
        c, t = "".join(content), "".join(thinking)
        return [self._piece(c, t)] if c or t else []

    def final_chunk(self, ev: Any) -> list[dict[str, Any]]:
        out = []
        if self.calls:
            pairs = [(n, a) for _, (n, a) in sorted(self.calls.items())]
            out.append(self._piece("", "", self._calls(pairs)))
        return out + [self._stats(self._piece(""), ev)]

    def usage_chunk(self, ev: Any) -> None:
        return None

    def response(self, text: str, probs: list[Any], final: Any, tokens: list[int] | None = None) -> dict:
        msg = final.message
        if msg is None:
            return self._with_probs(self._stats(self._piece(text), final), probs)
        calls = self._calls([(c.name, c.arguments) for c in msg.tool_calls])
        out = self._stats(self._piece(msg.content or "", msg.reasoning_content or "", calls), final)
        return self._with_probs(out, probs)

    def error_event(self, e: APIError) -> dict[str, Any]:
        return error_body(e)


# -- the model ----------------------------------------------------------------------------------------


def _names(model_id: str) -> tuple[str, set[str]]:
    """The served model's ollama name (``name:tag``) and every name a request may give for it."""
    stem = model_id[:-5] if model_id.lower().endswith(".gguf") else model_id
    name = stem if ":" in stem else f"{stem}:latest"
    ok = {model_id, stem, name}
    return name, {n.lower() for n in ok}


def _details(info: dict[str, Any]) -> dict[str, Any]:
    parts = str(info.get("desc", "")).split()
    arch = str(info.get("arch", "")) or (parts[0] if parts else "")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": parts[1] if len(parts) > 2 else "",
        "quantization_level": parts[2] if len(parts) > 2 else "",
    }


def _jsonable(v: Any, verbose: bool) -> tuple[bool, Any]:
    if isinstance(v, bool | int | float | str):
        return True, v
    if hasattr(v, "item") and not hasattr(v, "__len__"):  # a numpy scalar
        return True, v.item()
    if isinstance(v, list | tuple) and verbose:
        items = [_jsonable(x, True) for x in v]
        return all(ok for ok, _ in items), [x for _, x in items]
    return False, None


def stamp(m: Any) -> tuple[str, str]:
    """(modified_at, digest) of a model's file; the digest names the file (path, size, mtime), not its
    bytes (hashing gigabytes per request is not worth it)."""
    p = Path(m.settings.model_path)
    try:
        st = p.stat()
        mtime, size = st.st_mtime, st.st_size
    except OSError:
        mtime, size = m.created, 0
    when = datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")
    return when, hashlib.sha256(f"{p.resolve()}:{size}:{mtime}".encode()).hexdigest()


def model_entry(m: Any, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model as ``/api/tags`` lists it (``info``: the backend's, or the file's header unloaded)."""
    info = m.backend.info() if info is None else info
    name, _ = _names(m.name)
    when, digest = stamp(m)
    size = int(info.get("size") or 0)
    return {"name": name, "model": name, "modified_at": when, "size": size, "digest": digest,
            "details": _details(info)}  # fmt: skip


def _until(m: Any, keep_alive: float | None) -> str:
    seconds = 365 * 100 * 86400 if keep_alive is None or keep_alive < 0 else keep_alive
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def capabilities(backend: Any, template: str) -> list[str]:
    if backend.embeddings:
        return ["embedding"]
    caps = ["completion"]
    if "tools" in template:
        caps.append("tools")
    if supports_thinking(template):
        caps.append("thinking")
    if getattr(backend, "mtmd", None) is not None:
        caps.append("vision")
    try:
        backend.fim_tokens()
        caps.append("insert")
    except Exception:  # no fill-in-the-middle tokens
        pass
    return caps


def template_of(backend: Any) -> str:
    return str(backend.info().get("chat_template") or "")


def add_routes(app: FastAPI, state: Any) -> None:
    router = state.router

    async def model(request: Request) -> Any:
        """The entry of the request's ``model`` (loaded; in router mode by its name, ``:latest`` optional)."""
        return await state.pick(request)

    def check_name(m: Any, given: str | None) -> str:
        """A single-model server answers only to its model's names (a router resolved them already)."""
        if not given:
            raise bad_request("model is required", "model")
        name, ok = _names(m.name)
        if router is None and given.lower() not in ok:
            raise APIError(404, f"model {brief(given)} not found; this server serves {name!r}")
        return given

    def keep(m: Any, keep_alive: Any) -> None:
        """ollama's ``keep_alive`` of a request (router mode: how long the model stays loaded after it)."""
        if router is not None:
            router.keep_alive(m, keep_alive)

    def unloads(keep_alive: Any) -> bool:
        return router is not None and router.parse_keep_alive(keep_alive) == 0

    @app.head("/")
    async def head_root() -> Response:
        return Response(status_code=200)

    if not any(
        getattr(r, "path", None) == "/" and "GET" in (getattr(r, "methods", None) or ()) for r in app.routes
    ):

        @app.get("/")
        async def root() -> PlainTextResponse:
            return PlainTextResponse("Ollama is running")

    @app.get("/api/version")
    async def version() -> dict[str, Any]:
        return {"version": VERSION}

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        if router is not None:
            return {"models": await run_in_threadpool(router.ollama_tags)}
        m = state.default
        m.ready()
        return {"models": [model_entry(m)]}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        out = []
        for m in [state.default] if router is None else router.entries():
            if router is None:
                m.ready()
            if m.engine is None or m.backend is None:
                continue
            e = model_entry(m)
            until = _until(m, router.keep_alive_of(m) if router is not None else None)
            e.update(expires_at=until, size_vram=0, context_length=int(m.engine.n_ctx_slot))
            out.append(e)
        return {"models": out}

    @app.post("/api/show")
    async def show(request: Request) -> dict[str, Any]:
        m = await model(request)
        _, backend = m.ready()
        body: ShowBody = await parsed_body(request, lambda raw: validate(ShowBody, raw))
        check_name(m, body.model or body.name)
        info = backend.info()
        mdl = getattr(backend, "model", None)
        meta = dict(getattr(mdl, "metadata", None) or {"general.architecture": info.get("arch", "")})
        model_info = {}
        for k, v in meta.items():
            ok, val = _jsonable(v, body.verbose)
            if ok:
                model_info[k] = val
            elif isinstance(v, list | tuple):
                model_info[k] = None  # (ollama's answer without verbose: the big arrays left out)
        template = str(info.get("chat_template") or "")
        when, _ = stamp(m)
        return {
            "license": str(meta.get("general.license", "")),
            "modelfile": f"# served by llamapy\nFROM {m.settings.model_path}\n",
            "parameters": "",
            "template": template,
            "details": _details(info),
            "model_info": model_info,
            "capabilities": capabilities(backend, template),
            "modified_at": when,
        }

    async def run_chat(
        request: Request, m: Any, chat: ChatCompletionRequest, n_predict: int | None, fmt: Any
    ) -> Any:
        engine, _ = m.ready()
        tokens, gp = await chat_inputs(chat, m, n_predict, "options.num_predict")
        return await generate(request, engine, tokens, gp, fmt, chat.stream)

    @app.post("/api/chat")
    async def chat(request: Request) -> Any:
        t0 = time.perf_counter()
        m = await model(request)
        engine, backend = m.ready()
        no_completions(backend)

        def plan(raw: dict[str, Any]) -> tuple[ChatBody, ChatCompletionRequest, int | None]:
            messages_fit(raw, engine)
            body: ChatBody = validate(ChatBody, raw)
            check_name(m, body.model)
            msgs = chat_messages(body.messages)
            req, n = to_chat(msgs, body, body.tools, template_of(backend))
            return body, req, n

        body, req, n_predict = await parsed_body(request, plan)
        keep(m, body.keep_alive)
        fmt = OllamaFormatter(body.model, "chat", t0, body.logprobs)
        fmt.load_ns = load_ns(request)
        return await run_chat(request, m, req, n_predict, fmt)

    @app.post("/api/generate")
    async def generate_(request: Request) -> Any:
        t0 = time.perf_counter()
        m = await model(request)
        engine, backend = m.ready()
        no_completions(backend)
        s = m.settings
        body: GenerateBody = await parsed_body(request, lambda raw: validate(GenerateBody, raw))
        check_name(m, body.model)
        keep(m, body.keep_alive)
        if body.template:
            raise not_supported("a custom 'template' (the model's own chat template is used)", "template")
        if body.top_logprobs and not body.logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if body.context:
            raise not_supported("'context' (send the conversation to /api/chat instead)", "context")
        fmt = OllamaFormatter(body.model, "generate", t0, body.logprobs)
        fmt.load_ns = load_ns(request)
        if not body.prompt and not body.images and body.suffix is None:  # ollama: load the model, say so
            return {"model": body.model, "created_at": _now(), "response": "", "done": True,
                    "done_reason": "unload" if unloads(body.keep_alive) else "load"}  # fmt: skip
        if not body.raw and body.suffix is None:
            msgs = [{"role": "system", "content": body.system}] if body.system else []
            msgs.append({"role": "user", "content": _content(body.prompt, body.images, "")})
            req, n_predict = to_chat(msgs, body, None, template_of(backend))
            return await run_chat(request, m, req, n_predict, fmt)
        # raw prompt or fill-in-the-middle: the /v1/completions path
        if body.images:
            raise not_supported("'images' with 'raw' or 'suffix'", "images")
        if body.think:
            raise not_supported("'think' with 'raw' or 'suffix'", "think")
        fields, n = _sampling(body.options)
        comp: dict[str, Any] = {"prompt": body.prompt, "stream": body.stream, **fields}
        rf = _format(body.format)
        if rf is not None:
            comp["response_format"] = rf
        req: CompletionRequest = _validate_with_options(CompletionRequest, comp, fields)
        n_predict = P.n_predict_from(
            n, "options.num_predict", engine.n_ctx_slot, s.defaults.n_predict, False, engine.context_shift
        )
        gp = await run_in_threadpool(
            P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n_predict, engine.n_parallel
        )
        gp.grammar = await run_in_threadpool(P.completion_grammar, req, getattr(backend, "vocab", None))
        if body.logprobs:
            gp.logprobs, gp.n_probs = True, body.top_logprobs or 0
        if body.suffix is not None:
            args = (body.prompt, body.suffix, backend, engine.n_batch, engine.n_ctx_slot, n_predict)
            tokens = await run_in_threadpool(suffix_tokens, *args)
        else:
            limit = None if engine.context_shift else engine.n_ctx_slot
            tokens = await run_in_threadpool(P.tokenize_prompt, body.prompt, backend, "prompt", limit)
        return await generate(request, engine, tokens, gp, fmt, body.stream)

    @app.post("/api/embed")
    async def embed(request: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        m = await model(request)
        body: EmbedBody = await parsed_body(request, lambda raw: validate(EmbedBody, raw))
        check_name(m, body.model)
        keep(m, body.keep_alive)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        vectors, n = await _embed(request, m, inputs, body.truncate, "input")
        if body.dimensions is not None:
            from ..api.embedding import normalize_embedding

            vectors = [normalize_embedding(v[: body.dimensions], 2) for v in vectors]
        return {"model": body.model, "embeddings": [v.tolist() for v in vectors],
                "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                "prompt_eval_count": n}  # fmt: skip

    @app.post("/api/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        m = await model(request)
        body: EmbeddingsBody = await parsed_body(request, lambda raw: validate(EmbeddingsBody, raw))
        check_name(m, body.model)
        keep(m, body.keep_alive)
        vectors, _ = await _embed(request, m, [body.prompt], True, "prompt", normalize=-1)
        return {"embedding": vectors[0].tolist()}

    async def _embed(
        request: Request, m: Any, inputs: list[str], truncate: bool, name: str, normalize: int = 2
    ) -> tuple[list[Any], int]:
        import numpy as np

        from ..api.embedding import normalize_embedding

        engine, backend = m.ready()
        if not backend.embeddings:
            raise APIError(501, "this server does not compute embeddings; start it with --embeddings")
        if not inputs:
            raise bad_request(f"'{name}' must not be empty", name)
        if len(inputs) > MAX_INPUTS:
            raise bad_request(
                f"'{name}' has {len(inputs)} inputs; the limit is {MAX_INPUTS} per request", name
            )
        lists = await run_in_threadpool(tokens_of, backend, engine, inputs, truncate, name)
        finals = await run_embeddings(request, engine, lists)
        vecs = [normalize_embedding(np.asarray(ev.embedding, dtype=np.float32).reshape(-1), normalize)
                for ev in finals]  # fmt: skip
        return vecs, sum(ev.n_prompt for ev in finals)

    if router is not None:
        from .ollama_store import add_routes as add_store_routes  # /api/pull, /api/delete, /api/copy

        add_store_routes(app, state)
        return

    @app.post("/api/pull")
    @app.post("/api/push")
    @app.post("/api/create")
    @app.post("/api/copy")
    @app.delete("/api/delete")
    async def store(request: Request) -> Any:
        raise APIError(
            501,
            f"{request.url.path} is not available on this server: it serves one model "
            f"({_names(state.default.name)[0]!r}) given at start; start it in router mode "
            "(--models-dir DIR) to pull, copy and delete models",
        )
