"""ollama's model store over the router (router mode): ``POST /api/pull`` (a Hub ref or a known name,
through :mod:`llamapy.hub`, progress streamed as ollama's NDJSON), ``DELETE /api/delete`` (a pulled model
leaves the cache too; files given to the server stay) and ``POST /api/copy`` (a new name, same model)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from .errors import APIError, bad_request
from .inputs import parsed_body
from .router import ModelSpec, Router, norm_name

log = logging.getLogger("llamapy.server")


def add_routes(app: FastAPI, state: Any) -> None:
    """ollama's ``/api/pull`` (a Hub ref or a known name, through :mod:`llamapy.hub`), ``/api/delete``
    and ``/api/copy`` over the router's models."""
    from .ollama import ndjson

    router: Router = state.router

    def field_of(body: Any, *keys: str) -> str:
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object")
        for k in keys:
            v = body.get(k)
            if isinstance(v, str) and v:
                return v
        raise bad_request(f"'{keys[0]}' is required", keys[0])

    @app.post("/api/pull")
    async def pull(request: Request) -> Any:
        body = await parsed_body(request, lambda b: b)
        name = field_of(body, "model", "name")
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise bad_request("'stream' must be a boolean", "stream")
        if router.pull_spec is None:
            raise APIError(501, "this server cannot pull models")

        def work() -> ModelSpec:
            try:
                return router.pull_spec(name)  # type: ignore[misc]
            except APIError:
                raise
            except Exception as e:
                raise APIError(400 if "not found" in str(e) else 502, f"pull {name}: {e}") from None

        if not stream:
            spec = await asyncio.to_thread(work)
            router.add(spec)
            return {"status": "success"}

        async def events() -> Any:
            yield ndjson({"status": "pulling manifest"})
            task = asyncio.ensure_future(asyncio.to_thread(work))
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                if not task.done():
                    yield ndjson({"status": f"pulling {name}"})
            try:
                spec = task.result()
            except APIError as e:
                yield ndjson({"error": e.message})
                return
            path = spec.path or spec.model
            size = os.path.getsize(path) if os.path.exists(path) else 0
            digest = "sha256:" + _digest(path)
            yield ndjson(
                {"status": f"pulling {digest[7:19]}", "digest": digest, "total": size, "completed": size}
            )
            yield ndjson({"status": "verifying sha256 digest"})
            router.add(spec)
            yield ndjson({"status": "writing manifest"})
            yield ndjson({"status": "success"})

        return StreamingResponse(events(), media_type="application/x-ndjson")

    @app.delete("/api/delete")
    async def delete(request: Request) -> Any:
        body = await parsed_body(request, lambda b: b)
        m = router.find(field_of(body, "model", "name"))
        spec = router.specs[m.name]
        router.remove(m.name)
        if spec.source == "pull":  # a downloaded model leaves the store too (files given to the server stay)
            from ..hub.store import remove

            try:
                await asyncio.to_thread(remove, spec.model)
            except Exception as e:  # already gone, or not a store model
                log.info("delete %s: %s", spec.model, e)
        return Response(status_code=200)

    @app.post("/api/copy")
    async def copy(request: Request) -> Any:
        body = await parsed_body(request, lambda b: b)
        src = router.find(field_of(body, "source"), "source")
        dest = field_of(body, "destination")
        if norm_name(dest) == norm_name(src.name):
            raise bad_request("'destination' must differ from 'source'", "destination")
        s = router.specs[src.name]
        router.add(ModelSpec(dest, s.model, s.mmproj, dict(s.args), "copy"))
        return Response(status_code=200)


def _digest(path: str) -> str:
    import hashlib

    try:
        st = os.stat(path)
        return hashlib.sha256(f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime}".encode()).hexdigest()
    except OSError:
        return hashlib.sha256(path.encode()).hexdigest()
