"""The FastAPI app: OpenAI-compatible and llama.cpp endpoints over one :class:`Engine`.

``create_app(settings, backend_factory)`` returns an app that starts listening at once and loads the
model in a background thread (``/health`` answers 503 until it is ready). Handlers never touch the
model: they validate, tokenize, hand a :class:`Task` to the engine thread and relay its events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from . import params as P
from .backend import Backend
from .choices import choice_params, generate_n
from .engine import Engine, Event, GenParams, Task
from .errors import APIError, bad_request
from .formats import SSE_DONE, ChatFormatter, CompletionFormatter, JSONAnswer, NativeFormatter, sse
from .infill import infill_tokens, suffix_tokens
from .metrics import Metrics
from .schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    InfillRequest,
    NativeCompletionRequest,
    TokenizeRequest,
    parse_json,
    validate,
)

log = logging.getLogger("llamapy.server")


@dataclass
class ServerSettings:
    model_path: str = ""
    alias: str | None = None
    api_keys: list[str] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=list)
    metrics: bool = False
    slots: bool = True
    slots_verbose: bool = False
    slot_save_path: str | None = None  # --slot-save-path: enables POST /slots/{id}?action=...
    max_body_bytes: int = 8 << 20
    n_batch: int | None = None  # tokens per engine step (default: the backend's n_batch)
    context_shift: bool = False  # --context-shift: a full slot drops old tokens instead of stopping
    cache_reuse: int = 0  # --cache-reuse N: re-use cached chunks of >= N tokens by shifting (0: off)
    warmup: bool = True  # run the kernels once before /health is ok (a backend with warmup()); --no-warmup
    defaults: P.Defaults = field(default_factory=P.Defaults)
    allow_image_urls: bool = False  # --allow-image-urls: fetch http(s) image URLs (public hosts only)

    @property
    def model_id(self) -> str:
        return self.alias or Path(self.model_path).name or "model"


class ServerState:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: Engine | None = None
        self.backend: Backend | None = None
        self.load_error: str | None = None
        self.metrics = Metrics()
        self.created = int(time.time())

    def ready(self) -> tuple[Engine, Backend]:
        if self.engine is None or self.backend is None:
            if self.load_error:
                raise APIError(503, f"the model failed to load: {self.load_error}")
            raise APIError(503, "Loading model", type="unavailable_error")
        return self.engine, self.backend

    def attach(self, backend: Backend) -> None:
        s = self.settings
        engine = Engine(
            backend,
            n_batch=s.n_batch,
            metrics=self.metrics,
            context_shift=s.context_shift,
            cache_reuse=s.cache_reuse,
        )
        engine.start()
        if s.warmup and callable(getattr(backend, "warmup", None)):
            t0 = time.perf_counter()
            try:
                engine.warmup()  # on the engine thread; /health stays 503 "Loading model" until done
                _warm_chat(backend)
                log.info("warm-up done in %.2f s", time.perf_counter() - t0)
            except Exception:  # an optimization only: serve anyway (the first request loads the kernels)
                log.exception("warm-up failed; serving without it")
        self.backend, self.engine = backend, engine


def _warm_chat(backend: Backend) -> None:
    """Plan one chat request (template, chat-format detection, their imports: ~0.2 s the first time),
    so that the first chat request after start costs what a later one does."""
    import anyio._backends._asyncio  # noqa: F401  (run_in_threadpool's backend, imported on first use)

    if getattr(backend, "embeddings", False):
        return
    req = validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": "Hello"}]})
    P.chat_tokens(P.chat_plan(req, backend).prompt, backend)


def create_app(settings: ServerSettings, backend_factory: Callable[[], Backend]) -> FastAPI:
    state = ServerState(settings)

    def load() -> None:
        try:
            state.attach(backend_factory())
            log.info("model loaded: %s", settings.model_path)
        except Exception as e:  # reported by /health and every endpoint
            log.exception("model load failed")
            state.load_error = f"{type(e).__name__}: {e}"

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=load, name="llamapy-load", daemon=True).start()
        yield
        if state.engine is not None:
            state.engine.stop()

    app = FastAPI(title="llamapy", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    _install_errors(app)
    _routes(app, state)
    from .guard import GuardMiddleware

    app.add_middleware(GuardMiddleware, api_keys=settings.api_keys, max_body_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials="*" not in settings.cors_origins,
        )
    return app


def _error_response(request: Request, exc: APIError) -> JSONResponse:
    """The error in the route's API shape: Anthropic's under /v1/messages, OpenAI's elsewhere."""
    from .guard import ANTHROPIC_PREFIX

    if request.url.path.startswith(ANTHROPIC_PREFIX):
        from .anthropic import error_body

        return JSONResponse(error_body(exc), status_code=exc.status)
    if request.url.path.startswith("/api/"):  # ollama's API: {"error": "message"}
        from .ollama import error_body as ollama_error

        return JSONResponse(ollama_error(exc), status_code=exc.status)
    return JSONResponse(exc.body(), status_code=exc.status)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = f"{request.method} {request.url.path}: " + (
            "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        )
        return _error_response(request, APIError(exc.status_code, msg))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return _error_response(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))


INLINE_BODY_BYTES = 64 << 10  # larger bodies are parsed and validated off the event loop


async def _body(request: Request, model: type) -> Any:
    raw = await request.body()
    if len(raw) <= INLINE_BODY_BYTES:
        return validate(model, parse_json(raw))
    return await run_in_threadpool(lambda: validate(model, parse_json(raw)))


def _routes(app: FastAPI, state: ServerState) -> None:
    s = state.settings

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> JSONResponse:
        state.ready()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> dict[str, Any]:
        _, backend = state.ready()
        info = backend.info()
        meta = {k: info[k] for k in ("n_vocab", "n_ctx_train", "n_embd", "size") if k in info}
        return {
            "object": "list",
            "data": [
                {
                    "id": s.model_id,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "llamapy",
                    "meta": meta,
                }
            ],
        }

    @app.get("/props")
    async def props() -> dict[str, Any]:
        engine, backend = state.ready()
        info = backend.info()
        return {
            "default_generation_settings": {
                "n_ctx": engine.n_ctx_slot,
                "params": _settings_dict(s.defaults.sampling, s.defaults.n_predict),
            },
            "total_slots": engine.n_parallel,
            "model_path": s.model_path,
            "model_alias": s.model_id,
            "chat_template": info.get("chat_template", ""),
            "bos_token": info.get("bos_token", ""),
            "eos_token": info.get("eos_token", ""),
            "embeddings": backend.embeddings,
            "modalities": {"vision": getattr(backend, "mtmd", None) is not None, "audio": False},
            "build_info": f"llamapy {__version__}",
        }

    @app.get("/slots")
    async def slots() -> list[dict[str, Any]]:
        if not s.slots:
            raise APIError(501, "this server does not expose slots (started with --no-slots)")
        engine, _ = state.ready()
        return engine.slots_info(verbose=s.slots_verbose)

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request) -> dict[str, Any]:
        from .slots import slot_action

        engine, _ = state.ready()
        raw = await request.body()
        body = parse_json(raw) if raw.strip() else {}
        return await slot_action(engine, s.slot_save_path, id_slot, request.query_params.get("action"), body)

    from .lora import add_routes as add_lora_routes

    add_lora_routes(app, state)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        if not s.metrics:
            raise APIError(501, "this server does not expose metrics; start it with --metrics")
        engine, _ = state.ready()
        engine._update_gauges()
        return PlainTextResponse(state.metrics.prometheus(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        _, backend = state.ready()
        req: TokenizeRequest = await _body(request, TokenizeRequest)
        toks = await run_in_threadpool(backend.tokenize, req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return {"tokens": toks}
        out = []
        for t in toks:
            piece = backend.token_to_piece(t, special=True)
            try:
                out.append({"id": t, "piece": piece.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": t, "piece": list(piece)})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        _, backend = state.ready()
        req: DetokenizeRequest = await _body(request, DetokenizeRequest)
        P.check_tokens(req.tokens, backend.n_vocab, "tokens")
        return {"content": await run_in_threadpool(backend.detokenize, req.tokens)}

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict[str, Any]:
        _, backend = state.ready()
        req: ApplyTemplateRequest = await _body(request, ApplyTemplateRequest)
        creq = ChatCompletionRequest(messages=req.messages, add_generation_prompt=req.add_generation_prompt)
        text, _ = await run_in_threadpool(P.chat_prompt, creq, backend)
        return {"prompt": text}

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request) -> Any:
        engine, backend = state.ready()
        _no_completions(backend)
        req: ChatCompletionRequest = await _body(request, ChatCompletionRequest)
        n_predict, name = req.max_tokens, "max_tokens"
        if req.max_completion_tokens is not None:
            n_predict, name = req.max_completion_tokens, "max_completion_tokens"
        tokens, gp = await chat_inputs(req, state, n_predict, name, n_allowed=True)
        n = P.n_choices(req)
        if n > 1:
            fmts = [ChatFormatter(s.model_id, bool(req.logprobs)) for _ in range(n)]
            return await generate_n(
                request, engine, tokens, choice_params(gp, n), fmts, req.stream, _include_usage(req)
            )
        fmt = ChatFormatter(s.model_id, bool(req.logprobs))
        return await _generate(request, engine, tokens, gp, fmt, req.stream, _include_usage(req))

    from .anthropic import add_messages_routes
    from .responses import add_responses_routes

    add_responses_routes(app, state)
    add_messages_routes(app, state)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        engine, backend = state.ready()
        _no_completions(backend)
        req: CompletionRequest = await _body(request, CompletionRequest)
        P.check_unsupported(req)
        n_predict = P.n_predict_from(
            req.max_tokens, "max_tokens", engine.n_ctx_slot, 16, False, engine.context_shift
        )
        gp = await run_in_threadpool(
            P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n_predict, engine.n_parallel
        )
        if req.logprobs is not None:
            gp.logprobs, gp.n_probs = True, req.logprobs
        gp.grammar = await run_in_threadpool(P.completion_grammar, req, getattr(backend, "vocab", None))
        if req.suffix is not None:  # fill-in-the-middle: the prompt is the prefix
            args = (req.prompt, req.suffix, backend, engine.n_batch, engine.n_ctx_slot, n_predict)
            tokens = await run_in_threadpool(suffix_tokens, *args)
        else:
            limit = None if engine.context_shift else engine.n_ctx_slot
            tokens = await run_in_threadpool(P.tokenize_prompt, req.prompt, backend, "prompt", limit)
        echo = ""
        if req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else backend.detokenize(tokens)
        n = P.n_choices(req)
        fmts = [CompletionFormatter(s.model_id, req.logprobs is not None, echo) for _ in range(n)]
        if n > 1:
            return await generate_n(
                request, engine, tokens, choice_params(gp, n), fmts, req.stream, _include_usage(req)
            )
        return await _generate(request, engine, tokens, gp, fmts[0], req.stream, _include_usage(req))

    async def native_params(req: NativeCompletionRequest) -> tuple[GenParams, dict[str, Any]]:
        """``/completion`` and ``/infill``: GenParams (one choice, the grammar) and the settings echoed back."""
        engine, backend = state.ready()
        P.n_choices(req, allowed=False)
        n_predict = P.native_n_predict(req, engine.n_ctx_slot, s.defaults, engine.context_shift)
        gp = await run_in_threadpool(
            P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n_predict, engine.n_parallel
        )
        gp.grammar = await run_in_threadpool(P.completion_grammar, req, getattr(backend, "vocab", None))
        settings = _settings_dict(gp.sampling, gp.n_predict) | {"stop": gp.stop, "n_probs": gp.n_probs}
        return gp, settings

    @app.post("/completion")
    @app.post("/completions")
    async def completion_native(request: Request) -> Any:
        engine, backend = state.ready()
        _no_completions(backend)
        req: NativeCompletionRequest = await _body(request, NativeCompletionRequest)
        gp, settings = await native_params(req)
        limit = None if engine.context_shift else engine.n_ctx_slot
        tokens = await run_in_threadpool(P.tokenize_prompt, req.prompt, backend, "prompt", limit)
        prompt_text = req.prompt if isinstance(req.prompt, str) else backend.detokenize(tokens)
        fmt = NativeFormatter(s.model_id, prompt_text, settings, gp.n_probs, req.return_tokens)
        return await _generate(request, engine, tokens, gp, fmt, req.stream, False, done_marker=False)

    @app.post("/infill")
    async def infill(request: Request) -> Any:
        engine, backend = state.ready()
        _no_completions(backend)
        req: InfillRequest = await _body(request, InfillRequest)
        gp, settings = await native_params(req)
        args = (req, backend, engine.n_batch, engine.n_ctx_slot, gp.n_predict)
        tokens = await run_in_threadpool(infill_tokens, *args)
        prompt_text = backend.detokenize(tokens)
        fmt = NativeFormatter(s.model_id, prompt_text, settings, gp.n_probs, req.return_tokens)
        return await _generate(request, engine, tokens, gp, fmt, req.stream, False, done_marker=False)

    from .embeddings import add_embedding_routes  # /v1/embeddings, /embedding(s), /rerank, /v1/rerank...

    add_embedding_routes(app, state)
    from .ollama import add_ollama_routes  # /api/chat, /api/generate, /api/tags... (ollama's API)

    add_ollama_routes(app, state)


async def chat_inputs(
    req: ChatCompletionRequest,
    state: ServerState,
    n_predict: int | None,
    n_predict_name: str,
    n_allowed: bool = False,
) -> tuple[list[int], GenParams]:
    """A validated chat request -> its prompt tokens and :class:`GenParams` (planned: template, tools,
    grammar, parser); shared by chat completions and the Responses and Messages APIs (``n_allowed``:
    chat completions only, which answers ``n > 1`` itself)."""
    engine, backend = state.ready()
    s = state.settings
    P.check_unsupported(req)
    P.n_choices(req, allowed=n_allowed)
    n = P.n_predict_from(
        n_predict, n_predict_name, engine.n_ctx_slot, s.defaults.n_predict, False, engine.context_shift
    )
    gp = await run_in_threadpool(
        P.gen_params, req, backend, s.defaults, engine.n_ctx_slot, n, engine.n_parallel
    )
    if req.logprobs:
        gp.logprobs, gp.n_probs = True, req.top_logprobs or 0
    elif req.top_logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    images = None
    if _has_image_parts(req):  # OpenAI image_url parts -> media markers; the images go in GenParams
        req, images = await run_in_threadpool(_split_images, req, backend, s.allow_image_urls)
    if not engine.context_shift and len(req.messages) > engine.n_ctx_slot:  # (each renders as >= 1 token)
        raise bad_request(
            f"{len(req.messages)} messages cannot fit a slot's context of {engine.n_ctx_slot} tokens "
            "(shorten the conversation or start the server with a larger -c or fewer -np)",
            "messages",
        )
    plan = await run_in_threadpool(P.chat_plan, req, backend)
    if images is None:
        limit = None if engine.context_shift else engine.n_ctx_slot  # a longer prompt is a 400: stop there
        tokens = await run_in_threadpool(P.chat_tokens, plan.prompt, backend, limit)
    else:
        tokens, gp.images = await run_in_threadpool(_image_tokens, plan.prompt, images, backend)
    gp.grammar, gp.preserved_tokens = plan.grammar, plan.preserved_tokens
    gp.chat_format, gp.chat_syntax = plan.format, plan.syntax
    return tokens, gp


def _has_image_parts(req: ChatCompletionRequest) -> bool:
    return any(isinstance(m.content, list) and any(p.type != "text" for p in m.content) for m in req.messages)


def _split_images(req: ChatCompletionRequest, backend: Backend, allow_remote: bool) -> tuple[Any, list[Any]]:
    """The request with each image part turned into a media-marker text part, and the decoded images."""
    from ..mtmd import MEDIA_MARKER, MtmdError
    from ..mtmd.prompt import split_content
    from .schemas import ChatMessage, ContentPart

    mt = getattr(backend, "mtmd", None)
    if mt is None:
        raise bad_request(
            "image content parts are not supported yet on this server: start it with --mmproj FILE for vision",
            "messages",
        )
    raw = [{"role": m.role, "content": [p.model_dump() for p in m.content]} if isinstance(m.content, list)
           else None for m in req.messages]  # fmt: skip
    try:
        split, encoded = split_content([r for r in raw if r is not None], allow_remote=allow_remote)
        bitmaps = [mt.bitmap_from_bytes(data, where) for where, data in encoded]
    except MtmdError as e:
        raise bad_request(str(e), "messages") from None
    it = iter(split)
    msgs = []
    for m, r in zip(req.messages, raw, strict=True):
        if r is not None:
            text = next(it)["content"]
            parts = [ContentPart(type="text", text=text)]
            m = ChatMessage(**{**m.model_dump(exclude_none=True), "content": parts})
        msgs.append(m)
    n_markers = sum(m.content[0].text.count(MEDIA_MARKER) for m, r in zip(msgs, raw, strict=True) if r)
    if n_markers != len(bitmaps):
        raise bad_request(f"the text of the messages may not contain {MEDIA_MARKER!r}", "messages")
    return req.model_copy(update={"messages": msgs}), bitmaps


def _image_tokens(prompt: str, bitmaps: list[Any], backend: Backend) -> tuple[list[int], dict[int, Any]]:
    """The prompt's token view (negative pseudo tokens at image positions) and its images by first token."""
    from ..mtmd import MtmdError
    from ..mtmd.prompt import chunk_tokens, dedupe_bos, image_map

    mt = backend.mtmd  # type: ignore[attr-defined]
    try:
        chunks = dedupe_bos(mt.tokenize(prompt, bitmaps), getattr(mt.vocab, "bos", -1))
    except MtmdError as e:
        raise bad_request(str(e), "messages") from None
    n_ub = int(backend.ctx.n_ubatch)  # type: ignore[attr-defined]
    for ch in image_map(chunks).values():
        if ch.non_causal and ch.n_tokens > min(n_ub, int(backend.n_batch)):
            raise bad_request(
                f"an image takes {ch.n_tokens} tokens, more than the server's batch (-b/-ub {n_ub})",
                "messages",
            )
    return chunk_tokens(chunks), image_map(chunks)


def _no_completions(backend: Backend) -> None:
    if backend.embeddings:
        raise APIError(
            501, "this server computes embeddings only; start it without --embeddings for completions"
        )


def _include_usage(req: Any) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _settings_dict(cfg: Any, n_predict: int) -> dict[str, Any]:
    d = asdict(cfg)
    d["logit_bias"] = [[k, v] for k, v in cfg.logit_bias.items()]
    d["samplers"] = list(cfg.samplers)
    d["n_predict"] = n_predict
    return d


class _Stream:
    """Relays a task's events from the engine thread to this request's event loop."""

    def __init__(self, engine: Engine, tokens: list[int], gp: GenParams, kind: str = "completion") -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.engine = engine
        self.task = Task(tokens, gp, self._sink, kind)
        self.done = False

    def _sink(self, ev: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    def start(self) -> None:
        if len(self.task.prompt) >= self.engine.n_ctx_slot and not self.engine.context_shift:
            from .engine import _prompt_error

            raise _prompt_error(len(self.task.prompt), self.engine.n_ctx_slot)
        if not self.task.prompt:
            raise bad_request("the prompt is empty (it tokenized to no tokens)", "prompt")
        self.engine.submit(self.task)

    async def next(self) -> Event:
        ev = await self.queue.get()
        if ev.done:
            self.done = True
        if ev.error is not None:
            raise ev.error
        return ev

    def close(self) -> None:
        """Abandon the task (client gone, or the handler ended); wakes a pending :meth:`next`."""
        if not self.done:
            self.engine.cancel(self.task)
            self.done = True
            self.queue.put_nowait(Event(done=True, error=APIError(499, "the client closed the request")))


async def _watch_disconnect(request: Request, stream: _Stream) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            stream.close()
            return


async def _collect(
    request: Request,
    engine: Engine,
    tokens: list[int],
    gp: GenParams,
    kind: str = "completion",
    st: _Stream | None = None,
):
    if st is None:
        st = _Stream(engine, tokens, gp, kind)
        st.start()
    watcher = asyncio.create_task(_watch_disconnect(request, st))
    try:
        text, probs, tokens = [], [], []
        while True:
            ev = await st.next()
            text.append(ev.text)
            probs += ev.probs
            tokens += ev.tokens
            if ev.done:
                return "".join(text), probs, tokens, ev
    finally:
        watcher.cancel()
        st.close()


async def _generate(
    request: Request,
    engine: Engine,
    tokens: list[int],
    gp: GenParams,
    fmt: Any,
    stream: bool,
    include_usage: bool,
    done_marker: bool = True,
) -> Any:
    if not stream:
        text, probs, out_tokens, final = await _collect(request, engine, tokens, gp)
        return JSONAnswer(fmt.response(text, probs, final, tokens=out_tokens))
    st = _Stream(engine, tokens, gp)
    st.start()
    # errors before the first token are plain HTTP errors; a client that leaves while its prompt is
    # evaluated is noticed here (after that, the streaming response watches for the disconnect)
    watcher = asyncio.create_task(_watch_disconnect(request, st))
    try:
        first = await st.next()
    except BaseException:
        st.close()
        raise
    finally:
        watcher.cancel()

    # a formatter may give several events per call (a list), none (None), and its own SSE encoding
    enc = getattr(fmt, "encode", sse)

    def out(obj: Any) -> list[bytes]:
        return [] if obj is None else [enc(o) for o in (obj if isinstance(obj, list) else [obj])]

    async def events() -> AsyncIterator[bytes]:
        try:
            for b in out(fmt.first_chunk()):
                yield b
            ev = first
            while True:
                if ev.done:
                    if not isinstance(fmt, NativeFormatter):
                        for c in fmt.chunks(ev):
                            yield enc(c)
                    for b in out(fmt.final_chunk(ev)):
                        yield b
                    if include_usage:
                        for b in out(fmt.usage_chunk(ev)):
                            yield b
                    break
                for c in fmt.chunks(ev):
                    yield enc(c)
                ev = await st.next()
            if done_marker:
                yield SSE_DONE
        except APIError as e:
            on_error = getattr(fmt, "error_event", None)
            yield enc(on_error(e)) if on_error is not None else sse(e.body())
        finally:
            st.close()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
