"""The server's state, keyed by model: each :class:`ModelEntry` has its settings, its backend factory, and
once loaded its own backend, :class:`Engine` (slots, engine thread) and metrics.

A server started with one model (``-m``) holds one entry, loaded at start and kept; in router mode
(``--models-dir``, ``--models-preset``, see :mod:`llamapy.server.router`) entries are loaded by the first
request that names them and unloaded by LRU or idle time. Route handlers ask :meth:`ServerState.pick` for
the entry a request is for and use its engine and backend.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Request

from .._dataclass import dataclass
from . import params as P
from .backend import Backend
from .engine import Engine
from .errors import APIError
from .metrics import Metrics
from .schemas import ChatCompletionRequest, validate

if TYPE_CHECKING:
    from .router import Router

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
    mcp_config: str | None = None  # --mcp-config FILE: MCP servers whose tools chat requests may use
    mcp_max_steps: int = 8  # --mcp-max-steps: model steps of one MCP agent answer
    mcp_confirm: bool = False  # --mcp-confirm: each MCP tool call waits for POST /mcp/confirm
    cache_type_k: str = "f16"  # -ctk/-ctv: the KV cache's types (the router's memory check sizes it by them)
    cache_type_v: str = "f16"
    api_prefix: str = ""  # --api-prefix: every route under this path ("/api"; server/prefix.py)

    @property
    def model_id(self) -> str:
        return self.alias or Path(self.model_path).name or "model"


UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"


class ModelEntry:
    """One model the server knows: its settings and backend factory; once loaded, its engine."""

    def __init__(
        self, settings: ServerSettings, factory: Callable[[], Backend], name: str | None = None
    ) -> None:
        self.settings = settings
        self.name = name or settings.model_id
        self.factory = factory
        self.engine: Engine | None = None
        self.backend: Backend | None = None
        self.load_error: str | None = None
        self.load_status = 503  # the HTTP status of load_error (a model too big for memory: 507)
        self.metrics = Metrics()
        self.created = int(time.time())
        self.status = UNLOADED
        self.last_used = time.monotonic()  # LRU and keep-alive (seen busy counts as used)
        self.keep_alive: float | None = None  # seconds idle before unloaded (None: the server's default)
        self.load_seconds = 0.0
        self.lock = threading.Lock()  # load/unload of this entry, one at a time
        self.active = 0  # requests in flight (router mode: never unloaded under one)
        self.extra_files: list[str] = []  # mmproj, draft model: counted by the memory check
        self.n_ctx = 0  # the context it is loaded with (the memory check's KV cache; 0: the model's)

    def ready(self) -> tuple[Engine, Backend]:
        if self.engine is None or self.backend is None:
            if self.load_error:
                raise APIError(self.load_status, f"the model failed to load: {self.load_error}")
            raise APIError(503, "Loading model", type="unavailable_error")
        return self.engine, self.backend

    def load(self) -> None:
        """Build the backend and start its engine (blocking; on any thread). A failure is kept in
        :attr:`load_error` and answered to the requests for this model."""
        with self.lock:
            if self.engine is not None:
                return
            self.status, self.load_error = LOADING, None
            t0 = time.perf_counter()
            try:
                self.attach(self.factory())
                self.load_seconds = time.perf_counter() - t0
                self.status = LOADED
                log.info("model loaded: %s (%.2f s)", self.settings.model_path, self.load_seconds)
            except Exception as e:  # reported by /health and every endpoint for this model
                log.exception("model load failed: %s", self.name)
                self.load_error, self.status = f"{type(e).__name__}: {e}", FAILED
                self.load_status = int(getattr(e, "http_status", 503))

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
                _warm_chat(backend, s.defaults)
                log.info("warm-up done in %.2f s", time.perf_counter() - t0)
            except Exception:  # an optimization only: serve anyway (the first request loads the kernels)
                log.exception("warm-up failed; serving without it")
        self.backend, self.engine = backend, engine
        self.last_used = time.monotonic()

    def unload(self) -> None:
        """Stop the engine and drop the backend (its memory goes with the last reference)."""
        with self.lock:
            engine, self.engine, self.backend = self.engine, None, None
            if self.status != FAILED:
                self.status = UNLOADED
            if engine is not None:
                engine.stop()
                log.info("model unloaded: %s", self.name)

    @property
    def busy(self) -> bool:
        """A request in flight, or a task on its engine."""
        return self.active > 0 or (self.engine is not None and not self.engine.idle)


def _warm_chat(backend: Backend, defaults: P.Defaults) -> None:
    """Plan one chat request (template, chat-format detection, their imports: ~0.2 s the first time),
    so that the first chat request after start costs what a later one does."""
    import anyio._backends._asyncio  # noqa: F401  (run_in_threadpool's backend, imported on first use)

    if getattr(backend, "embeddings", False):
        return
    req = validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": "Hello"}]})
    P.chat_tokens(P.chat_plan(req, backend, defaults).prompt, backend)


class ServerState:
    """The models of one server (one entry for ``-m``, many in router mode) and what they share."""

    def __init__(
        self, settings: ServerSettings, default: ModelEntry | None = None, router: Router | None = None
    ):
        self.settings = settings  # the server's own settings (keys, limits, what it exposes)
        self.default = default  # the one model of a single-model server
        self.router = router
        self.created = int(time.time())
        self.response_store: Any = None  # (the Responses API's store, set by its routes)

    @property
    def entries(self) -> list[ModelEntry]:
        if self.router is not None:
            return self.router.entries()
        return [self.default] if self.default is not None else []

    async def pick(self, request: Request | None = None, name: str | None = None) -> ModelEntry:
        """The loaded entry a request is for: the one model of a single-model server (the request's
        ``model`` is not checked, as llama-server's), or in router mode the one named by ``name``, by
        the body's ``model`` or by ``?model=`` (loaded first if it is not yet)."""
        if self.router is not None:
            return await self.router.pick(request, name)
        assert self.default is not None
        self.default.ready()
        return self.default

    # a single-model server's entry, as attributes (tests and older callers read these)
    @property
    def engine(self) -> Engine | None:
        return self.default.engine if self.default is not None else None

    @property
    def backend(self) -> Backend | None:
        return self.default.backend if self.default is not None else None

    @property
    def metrics(self) -> Metrics | None:
        return self.default.metrics if self.default is not None else None

    def ready(self) -> tuple[Engine, Backend]:
        assert self.default is not None
        return self.default.ready()
