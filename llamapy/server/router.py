"""Router mode: many models in one server (``llamapy serve --models-dir DIR``, ``--models-preset FILE``).

Each known model is a :class:`~llamapy.server.state.ModelEntry` with its own settings and, once loaded,
its own backend, engine thread and slots. A request's ``model`` (the body's field, or ``?model=``) picks
the entry; the first request for an unloaded model loads it (once, however many requests wait for it), in
a worker thread, so requests to the other models go on meanwhile. At most ``models_max`` models are loaded
(the least recently used idle one is unloaded to make room); a model idle for ``keep_alive`` seconds is
unloaded (ollama's per-request ``keep_alive`` too). Before loading, the weights and the KV cache are
checked against free memory. A model that fails to load answers its error to its own requests only.

Endpoints as llama-server's router: ``GET /v1/models`` (every model with its state: loaded, loading,
unloaded, failed), ``POST /models/load`` and ``POST /models/unload`` (``{"model": NAME}``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from .._dataclass import dataclass
from .errors import APIError, bad_request
from .state import FAILED, LOADED, LOADING, UNLOADED, ModelEntry

log = logging.getLogger("llamapy.server")

FREE_MEMORY_ENV = "LLAMAPY_FREE_MEMORY"  # bytes of free memory the check assumes (tests; unset: measured)
FOREVER = -1.0
SWEEP_SECONDS = 0.2
BUSY_WAIT_SECONDS = 60.0  # how long a load waits for a loaded model to become idle (--models-max)
LOAD_FAILED = 424  # a model that failed to load (bad file, too big): a 4xx, not retried by clients


@dataclass
class ModelSpec:
    """A model the router knows: its name, what loads it (a path, a known name or ``user/repo[:quant]``),
    its mmproj, and the per-model arguments of a preset (``--models-preset``)."""

    name: str
    model: str
    mmproj: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    source: str = "dir"  # "dir" (--models-dir), "preset", "pull" (POST /api/pull), "copy"
    path: str | None = None  # the file, once known (a pulled model's download)


# -- finding models ----------------------------------------------------------------------------------

_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})$")


def scan_models_dir(root: str | os.PathLike) -> list[ModelSpec]:
    """Every GGUF model under ``root``: a split model once (its first part), an ``mmproj*`` file paired with
    the model of its folder (the one whose name it contains, or the folder's only model). A model alone in
    a sub-folder is named by the folder (llama-server's layout); others by their file name."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--models-dir {root}: not a folder")
    by_dir: dict[Path, tuple[list[Path], list[Path]]] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix.lower() != ".gguf":
            continue
        models, projs = by_dir.setdefault(p.parent, ([], []))
        if "mmproj" in p.name.lower():
            projs.append(p)
            continue
        m = _SPLIT.match(p.stem)
        if m and int(m.group(2)) != 1:
            continue  # a later part of a split model (the first part opens it)
        models.append(p)
    specs = []
    for d, (models, projs) in by_dir.items():
        for p in models:
            stem = _SPLIT.sub(r"\1", p.stem)
            mm = [q for q in projs if stem.lower() in q.name.lower()]
            if not mm and len(models) == 1:
                mm = projs
            if d != root and len(models) == 1:
                name = d.relative_to(root).as_posix()
            else:
                name = (d.relative_to(root) / stem).as_posix() if d != root else stem
            specs.append(ModelSpec(name, str(p), str(mm[0]) if mm else None))
    return specs


def load_preset(path: str | os.PathLike) -> tuple[dict[str, Any], list[ModelSpec]]:
    """A TOML preset: ``["*"]`` holds the arguments of every model, each other table one model (its
    ``model`` key a path, a known name or ``user/repo[:quant]``; without it the table's name). Keys are
    ``llamapy serve``'s long or short options without dashes (``ctx-size``, ``c``, ``parallel``,
    ``chat-template``, ``model-draft``, ``lora``...)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--models-preset {path}: not TOML: {e}") from None
    common = data.pop("*", {})
    data.pop("version", None)
    specs = []
    for name, args in data.items():
        if not isinstance(args, dict):
            raise ValueError(f"--models-preset {path}: [{name}] must be a table of options, got {args!r}")
        args = dict(args)
        model = str(args.pop("model", None) or args.pop("m", None) or args.pop("hf", None) or name)
        mmproj = args.pop("mmproj", None)
        specs.append(ModelSpec(name, model, str(mmproj) if mmproj else None, args, "preset"))
    if not isinstance(common, dict):
        raise ValueError(f'--models-preset {path}: ["*"] must be a table of options')
    return common, specs


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, what: str = "keep_alive") -> float:
    """ollama's ``keep_alive``: seconds (a number) or a Go duration (``"5m"``, ``"1h30m"``, ``"-1"``);
    negative: forever. A bad value is a :class:`ValueError` naming ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration such as 5m, 30s or -1, got {value!r}")
    if isinstance(value, int | float):
        return FOREVER if value < 0 else float(value)
    s = str(value).strip()
    try:
        v = float(s)
        return FOREVER if v < 0 else v
    except ValueError:
        pass
    neg = s.startswith("-")
    body = s[1:] if neg or s.startswith("+") else s
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{what} must be a duration such as 5m, 30s or -1, got {str(value)[:40]!r}")
    total = sum(float(n) * _UNITS[u] for n, u in parts)
    return FOREVER if neg and total > 0 else total


# -- memory ------------------------------------------------------------------------------------------


def free_memory() -> int | None:
    """Bytes free for a new model: ``LLAMAPY_FREE_MEMORY`` when set (tests), else the system's figure."""
    env = os.environ.get(FREE_MEMORY_ENV, "").strip()
    if env:
        if not env.isdigit():  # the load fails with this message (a 424), not a bare int() error
            raise ValueError(f"{FREE_MEMORY_ENV}={env!r}: expected a byte count")
        return int(env)
    from ..memory.fit import available_memory

    return available_memory()


def model_bytes(
    path: str, n_ctx: int, extra: list[str | None] = (), type_k: str = "f16", type_v: str = "f16"
) -> tuple[int, int]:
    """(weights bytes: every part of a split model and the ``extra`` files, KV cache bytes of ``n_ctx``
    cells with K and V of ``type_k``/``type_v`` (-ctk/-ctv)) read from the files' headers, without loading
    them."""
    from ..ggml.types import row_size
    from ..gguf.reader import GGUFReader
    from ..memory.kv_cache import kv_type

    p = Path(path)
    weights = 0
    m = _SPLIT.match(p.stem)
    parts = sorted(p.parent.glob(f"{m.group(1)}-*-of-{m.group(3)}.gguf")) if m else [p]
    for q in [*parts, *(Path(e) for e in extra if e)]:
        weights += q.stat().st_size
    with GGUFReader(p) as r:
        arch = str(r.get("general.architecture", ""))

        def key(k: str, default: Any = 0) -> Any:
            v = r.get(f"{arch}.{k}", default)
            return v if not isinstance(v, list | tuple) else (max(v) if v else default)

        n_layer, n_embd = int(key("block_count")), int(key("embedding_length"))
        n_head = int(key("attention.head_count")) or 1
        n_head_kv = int(key("attention.head_count_kv", n_head)) or n_head
        k_len = int(key("attention.key_length", n_embd // n_head))
        v_len = int(key("attention.value_length", n_embd // n_head))
        n_ctx = n_ctx or int(key("context_length", 4096))
    kv = (
        n_ctx
        * n_layer
        * (row_size(kv_type(type_k), n_head_kv * k_len) + row_size(kv_type(type_v), n_head_kv * v_len))
    )
    return weights, kv


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 28 else f"{n / (1 << 20):.1f} MiB"


# -- the router --------------------------------------------------------------------------------------


class Router:
    """The models of a router-mode server and their loading, unloading and picking (see the module)."""

    def __init__(
        self,
        specs: list[ModelSpec],
        make_entry: Callable[[ModelSpec], ModelEntry],
        models_max: int = 4,
        keep_alive: float = FOREVER,
        autoload: bool = True,
        pull: Callable[[str], ModelSpec] | None = None,
        load_on_startup: list[str] | None = None,
    ) -> None:
        self.make_entry = make_entry
        self.models_max = models_max  # 0: no limit
        self.default_keep_alive = keep_alive
        self.autoload = autoload
        self.pull_spec = pull
        self.specs: dict[str, ModelSpec] = {}
        self._entries: dict[str, ModelEntry] = {}
        self._loads: dict[str, asyncio.Future] = {}
        self._capacity: asyncio.Lock | None = None
        self._sweeper: asyncio.Task | None = None
        self.load_on_startup = load_on_startup or []
        self.loads_started = 0  # (tests: concurrent first requests load once)
        for s in specs:
            self.add(s)

    # registry

    def add(self, spec: ModelSpec) -> ModelEntry:
        if spec.name in self._entries and self._entries[spec.name].engine is not None:
            self._unload_now(self._entries[spec.name])
        self.specs[spec.name] = spec
        entry = self.make_entry(spec)
        entry.name = spec.name
        self._entries[spec.name] = entry
        return entry

    def remove(self, name: str) -> ModelSpec:
        m = self._entries.pop(name)
        self._unload_now(m)
        return self.specs.pop(name)

    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def names(self) -> str:
        return ", ".join(sorted(self._entries)) or "none"

    def find(self, given: Any, what: str = "model") -> ModelEntry:
        """The entry named ``given``: exactly, or ignoring case, ``.gguf``, ollama's ``:latest`` tag."""
        if not isinstance(given, str) or not given:
            raise bad_request(
                f"'{what}' is required in router mode (it picks the model; known models: {self.names()})",
                what,
            )
        if given in self._entries:
            return self._entries[given]
        want = norm_name(given)
        for name, m in self._entries.items():
            if norm_name(name) == want:
                return m
        shown = given if len(given) <= 80 else given[:77] + "..."
        raise APIError(404, f"model {shown!r} not found; known models: {self.names()}", param=what)

    # picking and loading

    async def pick(self, request: Request | None, name: str | None = None) -> ModelEntry:
        if name is None and request is not None:
            name = request.query_params.get("model")
            if name is None and request.method in ("POST", "PUT", "PATCH", "DELETE"):
                from .inputs import body_json

                body = await body_json(request)
                name = body.get("model") if isinstance(body, dict) else None
                if name is None and isinstance(body, dict):
                    name = body.get("name")  # (ollama's older field)
        m = self.find(name)
        autoload = self.autoload and (request is None or request.method != "GET")
        if request is not None:
            _hold(request, m)
        m.keep_alive = None  # this request's keep-alive: the server's (ollama's routes may set their own)
        if m.engine is None:
            if not autoload:
                if m.status == FAILED:
                    m.ready()  # raises the load error
                if m.name in self._loads:
                    raise APIError(503, f"Loading model {m.name!r}", type="unavailable_error")
                why = "--no-models-autoload" if not self.autoload else "a GET does not load models"
                raise APIError(
                    503,
                    f'model {m.name!r} is not loaded ({why}): POST /models/load {{"model": "{m.name}"}} first',
                )
            t0 = time.perf_counter()
            await self.ensure_loaded(m)
            if request is not None:
                request.scope["llamapy.load_seconds"] = time.perf_counter() - t0
        m.last_used = time.monotonic()
        m.ready()
        return m

    async def ensure_loaded(self, m: ModelEntry) -> None:
        if m.engine is not None:
            return
        if m.status == FAILED:
            m.ready()  # its error, until POST /models/load tries again
        fut = self._loads.get(m.name)
        if fut is None:
            fut = asyncio.ensure_future(self._load(m))
            self._loads[m.name] = fut
            fut.add_done_callback(
                lambda f, n=m.name: self._loads.pop(n, None) if self._loads.get(n) is f else None
            )
        await asyncio.shield(fut)

    async def _load(self, m: ModelEntry) -> None:
        self.loads_started += 1
        if self._capacity is None:
            self._capacity = asyncio.Lock()
        spec = self.specs[m.name]
        async with self._capacity:  # one capacity decision at a time; the load itself runs outside
            await self._make_room(m)
            m.status, m.load_error = LOADING, None
        try:
            await asyncio.to_thread(self._resolve, m, spec)
            await asyncio.to_thread(self._check_memory, m, spec)
        except APIError as e:
            m.status, m.load_error, m.load_status = FAILED, e.message, e.status
            raise
        except Exception as e:  # an unreachable Hub, a missing file...
            m.status, m.load_error, m.load_status = FAILED, f"{type(e).__name__}: {e}", LOAD_FAILED
            raise APIError(LOAD_FAILED, f"the model failed to load: {m.load_error}") from None
        await asyncio.to_thread(m.load)
        if m.status == FAILED:
            m.load_status = LOAD_FAILED
            m.ready()

    def _resolve(self, m: ModelEntry, spec: ModelSpec) -> None:
        """A known name or a Hub ref -> its file (downloaded once), before the memory check."""
        for p in (spec.path, spec.model):
            if p and os.path.exists(p):
                m.settings.model_path = p
                return
        from ..hub import resolve_model

        m.settings.model_path = str(resolve_model(spec.model))

    def _check_memory(self, m: ModelEntry, spec: ModelSpec) -> None:
        free = free_memory()
        if free is None:
            return
        try:
            st = m.settings
            weights, kv = model_bytes(st.model_path, m.n_ctx, m.extra_files, st.cache_type_k, st.cache_type_v)
        except Exception:  # an unreadable header: the load itself says what is wrong
            return
        if weights + kv > free:
            raise APIError(
                LOAD_FAILED,
                f"model {m.name!r} does not fit in memory: it needs {_gib(weights + kv)} (weights "
                f"{_gib(weights)}, KV cache {_gib(kv)}) and {_gib(free)} is free; unload a model "
                "(POST /models/unload), lower its context (-c) or use a smaller quant",
            )

    async def _make_room(self, m: ModelEntry) -> None:
        """Unload least recently used idle models until one more fits under ``models_max``."""
        if not self.models_max:
            return
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
        while True:
            held = [
                e
                for e in self._entries.values()
                if e is not m and (e.engine is not None or e.status == LOADING)
            ]
            if len(held) < self.models_max:
                return
            idle = [e for e in held if e.engine is not None and _idle(e)]
            if idle:
                self._unload_now(min(idle, key=lambda e: e.last_used))
                continue
            if time.monotonic() > deadline:
                raise APIError(
                    503,
                    f"{len(held)} models are loaded (--models-max {self.models_max}) and all are busy; "
                    "try again later",
                )
            await asyncio.sleep(0.1)

    def _unload_now(self, m: ModelEntry) -> None:
        """Detach the model's engine at once (on the event loop: no request can pick it after this) and
        stop it in a thread."""
        engine, m.engine, m.backend = m.engine, None, None
        if m.status != FAILED:
            m.status = UNLOADED
        if engine is not None:
            log.info("unloading model %s", m.name)
            import threading

            threading.Thread(target=engine.stop, name="llamapy-unload", daemon=True).start()

    # keep-alive

    def parse_keep_alive(self, value: Any) -> float | None:
        if value is None:
            return None
        try:
            return parse_duration(value)
        except ValueError as e:
            raise bad_request(str(e), "keep_alive") from None

    def keep_alive(self, m: ModelEntry, value: Any) -> None:
        m.keep_alive = self.parse_keep_alive(value)

    def keep_alive_of(self, m: ModelEntry) -> float | None:
        ka = m.keep_alive if m.keep_alive is not None else self.default_keep_alive
        return None if ka < 0 else max(0.0, ka - (time.monotonic() - m.last_used))

    async def start(self) -> None:
        self._capacity = asyncio.Lock()
        self._sweeper = asyncio.create_task(self._sweep())
        for name in self.load_on_startup:
            m = self._entries[name]
            task = asyncio.ensure_future(self.ensure_loaded(m))
            task.add_done_callback(lambda t: t.exception())  # (its error is kept in the entry)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            now = time.monotonic()
            for m in list(self._entries.values()):
                if m.engine is None:
                    continue
                if not _idle(m):
                    m.last_used = now
                    continue
                ka = m.keep_alive if m.keep_alive is not None else self.default_keep_alive
                if ka >= 0 and now - m.last_used >= ka:
                    self._unload_now(m)

    # listing

    def model_list(self) -> list[dict[str, Any]]:
        from .openai_api import model_object

        out = []
        for m in self._entries.values():
            obj = model_object(m, m.created)
            status: dict[str, Any] = {"value": m.status if m.engine is None else LOADED}
            if m.name in self._loads and m.engine is None and m.status != FAILED:
                status["value"] = LOADING
            if m.status == FAILED:
                status["failed"], status["error"] = True, m.load_error
            obj["status"] = status
            obj["source"] = self.specs[m.name].source
            out.append(obj)
        return out

    def ollama_tags(self) -> list[dict[str, Any]]:
        from .ollama import model_entry

        out = []
        for m in self.entries():
            if m.backend is not None:
                out.append(model_entry(m))
                continue
            info: dict[str, Any] = {}
            spec = self.specs[m.name]
            path = spec.path or spec.model
            if os.path.exists(path):
                m.settings.model_path = path
                info = _header_info(path)
            out.append(model_entry(m, info))
        return out


def norm_name(name: str) -> str:
    n = name.lower()
    if n.endswith(":latest"):
        n = n[: -len(":latest")]
    if n.endswith(".gguf"):
        n = n[:-5]
    return n


def _idle(m: ModelEntry) -> bool:
    return not m.busy


def _header_info(path: str) -> dict[str, Any]:
    """What ``/api/tags`` shows of an unloaded model: its size and its header's description."""
    from ..gguf.reader import GGUFReader

    info: dict[str, Any] = {"size": 0}
    try:
        info["size"] = os.path.getsize(path)
        with GGUFReader(path) as r:
            arch = str(r.get("general.architecture", ""))
            info["arch"] = arch
            ftype = r.get("general.file_type", None)
            info["desc"] = f"{arch} {r.get('general.size_label', '?')} {_ftype_name(ftype)}"
    except Exception:  # a truncated file still lists
        pass
    return info


def _ftype_name(ftype: Any) -> str:
    from ..model.model import _FTYPE_NAMES

    return str(_FTYPE_NAMES.get(ftype, "?")).split()[0] if isinstance(ftype, int) else "?"


# -- requests in flight: a model is never unloaded under one ----------------------------------------

_HELD = "llamapy.held"


def _hold(request: Request, m: ModelEntry) -> None:
    held = request.scope.get(_HELD)
    if held is None or m in held:
        return
    held.append(m)
    m.active += 1


class HoldMiddleware:
    """Counts each model's requests in flight (until the last byte of a streamed answer is sent)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list[ModelEntry] = []
        scope[_HELD] = held
        try:
            await self.app(scope, receive, send)
        finally:
            now = time.monotonic()
            for m in held:
                m.active -= 1
                m.last_used = now


# -- routes ------------------------------------------------------------------------------------------


def add_routes(app: FastAPI, state: Any) -> None:
    router: Router = state.router
    app.add_middleware(HoldMiddleware)

    async def named(request: Request) -> ModelEntry:
        from .inputs import body_json

        body = await body_json(request)
        return router.find(body.get("model") if isinstance(body, dict) else None)

    @app.post("/models/load")
    async def load(request: Request) -> dict[str, Any]:
        m = await named(request)
        if m.engine is not None:
            raise bad_request(f"model {m.name!r} is already loaded", "model")
        if m.status == FAILED:
            m.status, m.load_error = UNLOADED, None  # try again
        task = asyncio.ensure_future(router.ensure_loaded(m))
        task.add_done_callback(lambda t: t.exception())  # (its error is kept in the entry)
        return {"success": True}

    @app.post("/models/unload")
    async def unload(request: Request) -> dict[str, Any]:
        m = await named(request)
        if m.engine is None:
            raise bad_request(f"model {m.name!r} is not loaded", "model")
        if _idle(m):
            router._unload_now(m)
        else:
            m.keep_alive = 0.0  # unloaded as soon as its requests are answered
        return {"success": True}
