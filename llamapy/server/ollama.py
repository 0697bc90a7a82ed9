"""ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/tags``...) over the server's models.

A thin translation, as :mod:`llamapy.server.anthropic` is: a chat request becomes a
:class:`ChatCompletionRequest` (``options`` -> sampling fields, ``format`` -> ``response_format``, ``think``
-> the template's ``enable_thinking``, ``images`` -> OpenAI ``image_url`` parts, ``message.tool_calls``
with object arguments -> OpenAI tool calls) and runs through the same planning, engine task and token loop
as ``/v1/chat/completions``; ``/api/generate`` is a one-message chat, or with ``raw`` / ``suffix`` the
``/v1/completions`` path (the prompt as it is; fill-in-the-middle). Answers use ollama's field names, its
newline-delimited JSON stream (``stream`` defaults to true, as ollama's) and its final statistics; errors
are ``{"error": "message"}`` with the HTTP status.
The request bodies and their translation are :mod:`.ollama_requests`'s, the model entries (tags, show,
ps) :mod:`.ollama_models`'.

As ollama's, a request with nothing to generate (no messages, no prompt, no input) loads the model,
roles are case-insensitive, an integer option given as a float is truncated, an empty ``suffix`` is none
(Go's client always sends one) and a non-raw ``/api/generate`` answer ends with ``context`` (the prompt's
and answer's tokens), which a later request may send back.

On a one-model server ``model`` must name the served model (its alias or file name, ``:latest``
optional; anything else is a 404 that names it) and ``keep_alive`` is ignored (the model stays loaded);
``/api/pull``, ``/api/delete``, ``/api/copy`` answer 501 (``/api/push``, ``/api/create`` and
``/api/blobs`` always do). In router mode (:mod:`.router`) ``model`` picks
the model, ``keep_alive`` sets how long it stays loaded after the request, and pull, copy and delete
manage the router's list. Load-time options (``num_ctx``, ``num_thread``, ``num_gpu``, ``num_batch``...)
cannot change a loaded model: they are accepted and ignored.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from . import params as P
from .embeddings import run_embeddings, tokens_of
from .errors import APIError, bad_request, not_supported
from .formats import BaseFormatter
from .infill import suffix_tokens
from .inputs import chat_inputs, messages_fit, no_completions, parsed_body
from .ollama_models import (  # (model_entry: the router's /api/tags entries import it from here)
    _details,
    _jsonable,
    _names,
    _until,
    capabilities,
    model_entry,
    stamp,
    template_of,
)
from .ollama_requests import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    ShowBody,
    _content,
    _format,
    _sampling,
    _validate_with_options,
    chat_messages,
    to_chat,
)
from .responses import brief
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


def _call_id() -> str:
    """A tool call's id as ollama makes one: ``call_`` and 8 of [a-z0-9]."""
    return "call_" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))


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
        self.prompt_tokens: list[int] | None = None  # set: the final answer has ollama's ``context``
        self.out_tokens: list[int] = []

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
        if self.prompt_tokens is not None and self.kind == "generate":  # (ollama: not in raw mode)
            out["context"] = self.prompt_tokens + self.out_tokens
        return out

    @staticmethod
    def _calls(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [
            {"id": _call_id(), "function": {"index": i, "name": name, "arguments": _arguments(args)}}
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
        self.out_tokens += ev.tokens
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
        self.out_tokens = list(tokens or [])
        msg = final.message
        if msg is None:
            return self._with_probs(self._stats(self._piece(text), final), probs)
        calls = self._calls([(c.name, c.arguments) for c in msg.tool_calls])
        out = self._stats(self._piece(msg.content or "", msg.reasoning_content or "", calls), final)
        return self._with_probs(out, probs)

    def error_event(self, e: APIError) -> dict[str, Any]:
        return error_body(e)


def with_context(context: list[int], tokens: list[int], backend: Any, engine: Any) -> list[int]:
    """``/api/generate``'s ``context`` (the tokens an earlier answer gave back) before a prompt's tokens,
    the prompt's leading BOS dropped (ollama prepends the context's text to the prompt)."""
    n_vocab = int(getattr(backend, "n_vocab", 0) or 0)
    if n_vocab and any(not 0 <= t < n_vocab for t in context):
        raise bad_request(f"'context' holds a token outside the vocabulary (0..{n_vocab - 1})", "context")
    lead = backend.tokenize("", add_special=True, parse_special=False)
    if lead and tokens[: len(lead)] == lead:
        tokens = tokens[len(lead) :]
    out = list(context) + tokens
    if not engine.context_shift and len(out) >= engine.n_ctx_slot:
        raise bad_request(
            f"'context' and the prompt are {len(out)} tokens; this model's context is {engine.n_ctx_slot}",
            "context",
        )
    return out


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

    @app.api_route("/api/version", methods=["GET", "HEAD"])
    async def version() -> dict[str, Any]:
        return {"version": VERSION}

    @app.api_route("/api/tags", methods=["GET", "HEAD"])
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
        request: Request,
        m: Any,
        chat: ChatCompletionRequest,
        n_predict: int | None,
        fmt: Any,
        context: list[int] | None = None,
    ) -> Any:
        engine, backend = m.ready()
        tokens, gp = await chat_inputs(chat, m, n_predict, "options.num_predict")
        if context:
            tokens = with_context(context, tokens, backend, engine)
        if fmt.kind == "generate":
            fmt.prompt_tokens = tokens
        return await generate(request, engine, tokens, gp, fmt, chat.stream)

    def loaded(body: ChatBody | GenerateBody, kind: str) -> dict[str, Any]:
        """ollama's answer to a request with nothing to generate: it loads the model (or, with
        ``keep_alive`` 0 in router mode, unloads it)."""
        out: dict[str, Any] = {"model": body.model, "created_at": _now()}
        if kind == "chat":
            out["message"] = {"role": "assistant", "content": ""}
        else:
            out["response"] = ""
        return out | {"done": True, "done_reason": "unload" if unloads(body.keep_alive) else "load"}

    @app.post("/api/chat")
    async def chat(request: Request) -> Any:
        t0 = time.perf_counter()
        m = await model(request)
        engine, backend = m.ready()
        no_completions(backend)

        def plan(raw: dict[str, Any]) -> tuple[ChatBody, ChatCompletionRequest | None, int | None]:
            messages_fit(raw, engine)
            body: ChatBody = validate(ChatBody, raw)
            check_name(m, body.model)
            if not body.messages:
                return body, None, None
            msgs = chat_messages(body.messages)
            req, n = to_chat(msgs, body, body.tools, template_of(backend))
            return body, req, n

        body, req, n_predict = await parsed_body(request, plan)
        keep(m, body.keep_alive)
        if req is None:  # ollama: no messages loads the model (``ollama run`` does so first)
            return loaded(body, "chat")
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
        suffix = body.suffix or None  # (ollama: an empty suffix is none; Go's client always sends one)
        if body.raw and (body.template or body.system or body.context):
            raise bad_request("raw mode does not support template, system, or context")
        if body.template:
            raise not_supported("a custom 'template' (the model's own chat template is used)", "template")
        if body.top_logprobs and not body.logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if body.context and body.images:
            raise not_supported("'context' with 'images'", "context")
        fmt = OllamaFormatter(body.model, "generate", t0, body.logprobs)
        fmt.load_ns = load_ns(request)
        if not body.prompt and not body.images and suffix is None:  # ollama: load the model, say so
            return loaded(body, "generate")
        if not body.raw and suffix is None:
            msgs = [{"role": "system", "content": body.system}] if body.system else []
            msgs.append({"role": "user", "content": _content(body.prompt, body.images, "")})
            req, n_predict = to_chat(msgs, body, None, template_of(backend))
            return await run_chat(request, m, req, n_predict, fmt, body.context)
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
        if suffix is not None:
            args = (body.prompt, suffix, backend, engine.n_batch, engine.n_ctx_slot, n_predict)
            tokens = await run_in_threadpool(suffix_tokens, *args)
            if body.context:
                tokens = with_context(body.context, tokens, backend, engine)
            if not body.raw:  # (ollama: ``context`` in every answer but a raw one)
                fmt.prompt_tokens = tokens
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
        inputs = ([body.input] if body.input else []) if isinstance(body.input, str) else body.input or []
        if not inputs:  # (ollama: no input loads the model and answers no vectors)
            return {"model": body.model, "embeddings": []}
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
        if not body.prompt:  # (ollama: an empty request loads the model)
            return {"embedding": []}
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

    @app.head("/api/blobs/{digest}")
    async def head_blob(digest: str) -> Response:
        return Response(status_code=404)  # (no blob store: ``ollama create`` then uploads, refused below)

    @app.post("/api/blobs/{digest}")
    @app.post("/api/push")
    @app.post("/api/create")
    async def no_store(request: Request) -> Any:
        raise APIError(501, f"{request.url.path} is not available on this server: it cannot create or "
                       "push models (it serves GGUF files given to it, or pulled in router mode)")  # fmt: skip

    if router is not None:
        from .ollama_store import add_routes as add_store_routes  # /api/pull, /api/delete, /api/copy

        add_store_routes(app, state)
        return

    @app.post("/api/pull")
    @app.post("/api/copy")
    @app.delete("/api/delete")
    async def store(request: Request) -> Any:
        raise APIError(
            501,
            f"{request.url.path} is not available on this server: it serves one model "
            f"({_names(state.default.name)[0]!r}) given at start; start it in router mode "
            "(--models-dir DIR) to pull, copy and delete models",
        )
