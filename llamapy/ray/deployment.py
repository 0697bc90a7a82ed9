"""The Ray Serve application: an ingress and N replicas of the llamapy server.

- :class:`LlamapyReplica`: one llamapy server (the app of ``llamapy serve``, :func:`llamapy.server.create_app`,
  its engine, slots and prompt cache) driven in-process (:class:`~llamapy.ray.asgi.AsgiApp`): every route
  the single server has, streaming included, with no route declared here.
- :class:`LlamapyIngress`: the HTTP endpoint. It tokenizes a request's conversation with the model's
  vocabulary (:mod:`llamapy.ray.keys`) and relays it, through a handle whose router
  (:class:`~llamapy.ray.router.LlamapyRouter`) picks the replica; it answers ``/health`` and ``/metrics``
  for all replicas, and turns a replica lost mid-stream into an error event that ends the stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from .asgi import AsgiApp
from .keys import key_tokens

log = logging.getLogger("llamapy.ray")

REPLICA = "llamapy_replica"
INGRESS = "llamapy_ingress"
_HOP = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive"}


def _server(cfg: dict[str, Any]) -> Any:
    """The llamapy server app for a replica's config (the subset of ``llamapy serve``'s options)."""
    from ..sampling import LLAMA_DEFAULT_SEED, SamplingParams
    from ..server import ServerSettings, create_app
    from ..server.backend import ContextBackend
    from ..server.params import Defaults

    seed = cfg.get("seed", -1)
    defaults = Defaults(
        sampling=SamplingParams(seed=LLAMA_DEFAULT_SEED if seed < 0 else seed),
        n_predict=cfg.get("n_predict", -1),
    )
    settings = ServerSettings(
        model_path=cfg["model"],
        alias=cfg.get("alias"),
        api_keys=list(cfg.get("api_keys", [])),
        metrics=True,
        n_batch=cfg.get("batch_size", 512),
        warmup=cfg.get("warmup", True),
        defaults=defaults,
        max_body_bytes=cfg.get("max_body_bytes", 8 << 20),
    )

    def factory() -> ContextBackend:
        return ContextBackend(
            cfg["model"],
            n_ctx=cfg.get("ctx_size", 4096),
            n_seq_max=cfg.get("parallel", 1),
            n_batch=cfg.get("batch_size", 512),
            n_threads=cfg.get("threads"),
            chat_template=cfg.get("chat_template"),
        )

    return create_app(settings, factory)


class LlamapyReplica:
    """One llamapy server engine. Ready (to Ray Serve) once its model answers ``/health`` with 200."""

    async def __init__(self, cfg: dict[str, Any]) -> None:  # type: ignore[misc]
        self.asgi = AsgiApp(_server(cfg))
        await self.asgi.startup()
        ctx = serve.get_replica_context()
        self.replica_id = ctx.replica_id.unique_id
        self.actor_name = ctx.replica_id.to_full_id_str()  # the Ray actor's name (namespace "serve")
        deadline = time.monotonic() + cfg.get("load_timeout_s", 900)
        while True:
            status, body = await self._get("/health")
            if status == 200:
                return
            if b"Loading" not in body or time.monotonic() > deadline:
                raise RuntimeError(f"llamapy replica failed to start: {status} {body[:500]!r}")
            await asyncio.sleep(0.1)

    async def _get(self, path: str) -> tuple[int, bytes]:
        status, chunks = 500, []
        async for item in self.asgi.stream("GET", path):
            if isinstance(item, dict):
                status = item["status"]
            else:
                chunks.append(item)
        return status, b"".join(chunks)

    async def handle_request(self, route: dict[str, Any], req: dict[str, Any]) -> AsyncIterator[Any]:
        """Relay one HTTP request: ``{"status", "headers", "replica"}`` first, then the body's chunks."""
        first = True
        async for item in self.asgi.stream(
            req["method"], req["path"], req.get("query", b""), req.get("headers"), req.get("body", b"")
        ):
            if first and isinstance(item, dict):
                item = {**item, "replica": self.replica_id}
                first = False
            yield item

    async def probe(self, route: dict[str, Any], path: str) -> dict[str, Any]:
        """``GET path`` of this replica (``/health``, ``/metrics``, ``/slots``) for the ingress."""
        status, body = await self._get(path)
        return {"replica": self.replica_id, "actor": self.actor_name, "status": status, "body": body}

    async def check_health(self) -> None:
        """Ray Serve's periodic health check: a replica whose server stopped answering is restarted."""
        status, body = await self._get("/health")
        if status != 200:
            raise RuntimeError(f"llamapy replica unhealthy: {status} {body[:200]!r}")

    async def __del__(self) -> None:  # graceful shutdown (scale-down): stop the engine
        await self.asgi.shutdown()


def _error_chunk(path: str, message: str) -> bytes:
    """An error event in the stream's own format, ending a stream whose replica was lost."""
    if path.startswith("/v1/messages"):
        err = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(err).encode() + b"\n\n"
    if path.startswith("/api/"):  # ollama's NDJSON
        return json.dumps({"error": message}).encode() + b"\n"
    err = {"error": {"message": message, "type": "server_error", "code": 503}}
    return b"data: " + json.dumps(err).encode() + b"\n\n"


def _error_response(path: str, status: int, message: str) -> JSONResponse:
    if path.startswith("/v1/messages"):
        return JSONResponse({"type": "error", "error": {"type": "api_error", "message": message}}, status)
    if path.startswith("/api/"):
        return JSONResponse({"error": message}, status)
    return JSONResponse({"error": {"message": message, "type": "unavailable_error", "code": status}}, status)


class LlamapyIngress:
    """The endpoint: routes every request to a replica, aggregates ``/health`` and ``/metrics``."""

    def __init__(self, replicas: Any, cfg: dict[str, Any]) -> None:
        self.replicas = replicas
        self.cfg = cfg
        self.app_name = serve.get_replica_context().app_name
        self._vocab: Any = None
        self.max_body = int(cfg.get("max_body_bytes", 8 << 20))

    def router(self) -> Any:
        from .registry import router_for

        return router_for(self.app_name, REPLICA)

    def _tokenize(self, text: str) -> list[int]:
        if self._vocab is None:
            from ..vocab.vocab import load_vocab

            self._vocab = load_vocab(self.cfg["model"])
        return list(self._vocab.tokenize(text, add_special=False, parse_special=False))

    async def _route(self, body: bytes, headers: Any) -> dict[str, Any]:
        def key() -> tuple[list[int], str | None]:  # off the event loop: a hostile body may be slow to parse
            return key_tokens(json.loads(body) if body else None, self._tokenize)

        try:
            tokens, session = await asyncio.to_thread(key)
        except Exception:  # not JSON, odd shapes: no key; the replica answers the request as it is
            tokens, session = [], None
        return {"tokens": tokens, "session": headers.get("x-session-id") or session}

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path in ("/health", "/v1/health"):
            return await self._health()
        if request.method == "GET" and path == "/metrics":
            return await self._metrics()
        chunks, n = [], 0
        async for chunk in request.stream():  # read no further than the limit
            n += len(chunk)
            if n > self.max_body:
                return _error_response(path, 413, f"the request body is over {self.max_body} bytes")
            chunks.append(chunk)
        body = b"".join(chunks)
        route = await self._route(body, request.headers)
        req = {
            "method": request.method,
            "path": path,
            "query": request.url.query.encode(),
            "headers": [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP],
            "body": body,
        }
        return await self._forward(path, route, req)

    async def _forward(self, path: str, route: dict[str, Any], req: dict[str, Any]) -> Response:
        gen, start, err = None, None, None
        for _ in range(2):  # a replica lost before it answered: the request goes to another one
            gen = self.replicas.options(stream=True, method_name="handle_request").remote(route, req)
            try:
                start = await gen.__anext__()
                break
            except StopAsyncIteration:
                err = "the replica closed the response without answering"
            except Exception as e:  # its actor died or became unavailable
                err = f"the replica was lost: {type(e).__name__}"
                log.warning("llamapy replica lost before answering %s: %s", path, e)
        if start is None or gen is None:
            return _error_response(path, 503, f"no replica could answer: {err}")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"] if k not in _HOP]
        replica = start.get("replica", "")

        async def chunks() -> AsyncIterator[bytes]:
            done = False
            try:
                async for chunk in gen:
                    yield chunk
                done = True
            except Exception as e:  # the replica died mid-stream: end the stream with an error event
                done = True
                log.warning("llamapy replica %s lost mid-stream on %s: %s", replica, path, e)
                yield _error_chunk(path, f"the replica serving this stream was lost ({type(e).__name__})")
            finally:
                if not done:  # the client went away: the replica's app sees a disconnect and stops
                    gen.cancel()

        resp = StreamingResponse(chunks(), status_code=start["status"])
        for k, v in headers:
            resp.headers.append(k, v)
        resp.headers["x-llamapy-replica"] = replica
        return resp

    async def _probe_all(self, path: str, timeout: float = 3.0) -> list[dict[str, Any]]:
        router = self.router()
        if router is None:  # the handle builds its router on first use
            try:
                first = self.replicas.options(method_name="probe").remote({}, path)
                await asyncio.wait_for(first, timeout)
            except Exception:
                pass
            router = self.router()
        ids = router.replica_ids() if router is not None else []

        async def one(rid: str) -> dict[str, Any]:
            try:
                call = self.replicas.options(method_name="probe").remote({"pin": rid}, path)
                return await asyncio.wait_for(call, timeout)
            except Exception as e:
                return {"replica": rid, "status": 503, "body": f"unreachable: {type(e).__name__}".encode()}

        # one after the other: calls made while serving one HTTP request share its internal request id,
        # and Ray Serve's router fulfils concurrent calls with the same id as one (the others never route)
        return [await one(r) for r in ids]

    async def _health(self) -> JSONResponse:
        probes = await self._probe_all("/health")
        reps = []
        for p in probes:
            try:
                detail = json.loads(p["body"])
            except ValueError:
                detail = p["body"].decode("utf-8", "replace")
            reps.append(
                {"id": p["replica"], "actor": p.get("actor"), "status": p["status"], "health": detail}
            )
        ok = sum(r["status"] == 200 for r in reps)
        router = self.router()
        body = {
            "status": "ok" if ok else "unavailable",
            "replicas_ok": ok,
            "replicas": reps,
            "routing": router.snapshot() if router is not None else None,
        }
        return JSONResponse(body, 200 if ok else 503)

    async def _metrics(self) -> PlainTextResponse:
        probes = await self._probe_all("/metrics")
        seen: set[bytes] = set()
        lines: list[str] = []
        for p in probes:
            if p["status"] != 200:
                continue
            for line in p["body"].decode("utf-8", "replace").splitlines():
                if line.startswith("#"):
                    if line.encode() not in seen:
                        seen.add(line.encode())
                        lines.append(line)
                elif line.strip():
                    name, _, value = line.partition(" ")
                    label = f'replica="{p["replica"]}"'
                    name = name[:-1] + "," + label + "}" if name.endswith("}") else name + "{" + label + "}"
                    lines.append(f"{name} {value}")
        router = self.router()
        lines.append("# TYPE llamapy_ray:replicas gauge")
        lines.append(f"llamapy_ray:replicas {len(probes)}")
        lines.append(f"llamapy_ray:replicas_ok {sum(p['status'] == 200 for p in probes)}")
        if router is not None:
            lines.append("# TYPE llamapy_ray:routed_total counter")
            for reason, n in sorted(router.counts.items()):
                lines.append(f'llamapy_ray:routed_total{{reason="{reason}"}} {n}')
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def build_app(
    model: str,
    replicas: int = 1,
    *,
    threads: int | None = 1,
    parallel: int = 2,
    ctx_size: int = 4096,
    batch_size: int = 512,
    num_cpus: float | None = None,
    routing: str = "prefix",
    autoscaling_config: dict[str, Any] | None = None,
    max_ongoing_requests: int = 64,
    health_check_period_s: float = 2.0,
    graceful_shutdown_timeout_s: float = 30.0,
    **server: Any,
) -> serve.Application:
    """The Ray Serve application for ``model`` (a GGUF path every node can read): ``replicas`` llamapy
    servers (or ``autoscaling_config``: Ray Serve's ``min_replicas``, ``max_replicas``,
    ``target_ongoing_requests``, ...) behind one ingress. ``server``: more of the replica's options
    (``alias``, ``api_keys``, ``seed``, ``n_predict``, ``chat_template``, ``warmup``, ``max_body_bytes``)."""
    if routing not in ("prefix", "round_robin"):
        raise ValueError(f"routing must be 'prefix' or 'round_robin', not {routing!r}")
    if autoscaling_config is None and replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    cfg = {"model": str(model), "threads": threads, "parallel": parallel, "ctx_size": ctx_size,
           "batch_size": batch_size, **server}  # fmt: skip
    opts: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": num_cpus if num_cpus is not None else float(threads or 1)},
        "max_ongoing_requests": max_ongoing_requests,
        "health_check_period_s": health_check_period_s,
        "graceful_shutdown_timeout_s": graceful_shutdown_timeout_s,
        "max_constructor_retry_count": 2,  # a model that does not load fails the deployment, not 20 tries
        "request_router_config": RequestRouterConfig(
            request_router_class="llamapy.ray.router.LlamapyRouter",
            request_router_kwargs={"policy": routing},
        ),
    }
    if autoscaling_config is not None:
        opts["autoscaling_config"] = dict(autoscaling_config)
    else:
        opts["num_replicas"] = replicas
    replica = serve.deployment(LlamapyReplica, name=REPLICA).options(**opts).bind(cfg)
    ingress = serve.deployment(LlamapyIngress, name=INGRESS).options(
        num_replicas=1, max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0}
    )
    return ingress.bind(
        replica, {"model": str(model), "max_body_bytes": server.get("max_body_bytes", 8 << 20)}
    )
