"""The FastAPI app: the route table of every API over the model-keyed :class:`ServerState`.

``create_app(settings, backend_factory)`` returns a single-model app that starts listening at once and
loads the model in a background thread (``/health`` answers 503 until it is ready);
``create_app(settings, router=Router(...))`` serves many models (router mode, :mod:`.router`). Handlers
never touch a model: they validate, tokenize, hand a task to the model's engine thread and relay its
events (:mod:`.stream`), each API writing them with its :class:`~llamapy.server.stream.Formatter`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from . import anthropic, audio, embeddings, llamacpp_api, lora, mcp_http, ollama, openai_api, responses
from .backend import Backend
from .errors import APIError
from .guard import ANTHROPIC_PREFIX, GuardMiddleware
from .state import ModelEntry, ServerSettings, ServerState

__all__ = ["ROUTES", "ServerSettings", "ServerState", "create_app"]

log = logging.getLogger("llamapy.server")

# every API's routes, in registration order (ollama's last: it answers GET / only if nothing else does)
ROUTES: list[Callable[[FastAPI, ServerState], None]] = [
    llamacpp_api.add_routes,  # /health, /props, /slots, /metrics, /tokenize, /completion, /infill...
    lora.add_routes,  # /lora-adapters
    openai_api.add_routes,  # /v1/models, /v1/chat/completions, /v1/completions
    responses.add_routes,  # /v1/responses
    anthropic.add_routes,  # /v1/messages, /v1/messages/count_tokens
    embeddings.add_routes,  # /v1/embeddings, /embedding(s), /rerank, /v1/rerank...
    audio.add_routes,  # /v1/audio/transcriptions
    ollama.add_routes,  # /api/chat, /api/generate, /api/tags... (ollama's API)
    mcp_http.add_routes,  # /mcp/tools, /mcp/confirm (the MCP host, --mcp-config)
]


def create_app(
    settings: ServerSettings,
    backend_factory: Callable[[], Backend] | None = None,
    router: Any = None,
) -> FastAPI:
    """A single-model server (``backend_factory``), or a router over many models (``router``)."""
    if router is not None:
        state = ServerState(settings, router=router)
    else:
        assert backend_factory is not None, "create_app needs a backend factory or a router"
        state = ServerState(settings, default=ModelEntry(settings, backend_factory))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state.default is not None:
            threading.Thread(target=state.default.load, name="llamapy-load", daemon=True).start()
        if state.router is not None:
            await state.router.start()
        await mcp_http.start(app, settings)  # the MCP servers of --mcp-config start in the background
        yield
        await mcp_http.stop(app)
        if state.router is not None:
            await state.router.stop()
        for m in state.entries:
            if m.engine is not None:
                m.engine.stop()

    app = FastAPI(title="llamapy", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    _install_errors(app)
    for add in ROUTES:
        add(app, state)
    if router is not None:
        from .router import add_routes as add_router_routes

        add_router_routes(app, state)
    app.add_middleware(GuardMiddleware, api_keys=settings.api_keys, max_body_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials="*" not in settings.cors_origins,
        )
    if settings.api_prefix:  # outermost: what is inside sees the paths without it
        from .prefix import ApiPrefixMiddleware, normalize_prefix

        app.add_middleware(ApiPrefixMiddleware, prefix=normalize_prefix(settings.api_prefix))
    return app


def error_response(request: Request, exc: APIError) -> JSONResponse:
    """The error in the route's API shape: Anthropic's under /v1/messages, ollama's under /api/, OpenAI's
    elsewhere."""
    if request.url.path.startswith(ANTHROPIC_PREFIX):
        return JSONResponse(anthropic.error_body(exc), status_code=exc.status)
    if request.url.path.startswith(ollama.PREFIX):  # ollama's API: {"error": "message"}
        return JSONResponse(ollama.error_body(exc), status_code=exc.status)
    return JSONResponse(exc.body(), status_code=exc.status)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = f"{request.method} {request.url.path}: " + (
            "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        )
        return error_response(request, APIError(exc.status_code, msg))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))
