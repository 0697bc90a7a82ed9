"""Drive an ASGI app (the llamapy server's FastAPI app) inside a process, without a socket.

A replica holds the app that ``llamapy serve`` serves and answers each request relayed by the ingress
through it: the lifespan (which loads the model and starts the engine) runs once, and a request's
response comes back as a stream: first ``{"status", "headers"}``, then the body's chunks as the app sends
them (server-sent events included). Closing the stream early is a client disconnect to the app, which
then stops the generation as it does for a dropped socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

_DONE = object()


class AsgiApp:
    def __init__(self, app: Any) -> None:
        self.app = app
        self._lifespan: asyncio.Task[Any] | None = None
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._state: dict[str, Any] = {}

    async def startup(self) -> None:
        """Run the app's lifespan startup (and keep the lifespan task until :meth:`shutdown`)."""
        started = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            return await self._inbox.get()

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "lifespan.startup.complete" and not started.done():
                started.set_result(None)
            elif msg["type"] == "lifespan.startup.failed" and not started.done():
                started.set_exception(RuntimeError(msg.get("message") or "the app failed to start"))

        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self._state}
        await self._inbox.put({"type": "lifespan.startup"})
        self._lifespan = asyncio.ensure_future(self.app(scope, receive, send))
        done, _ = await asyncio.wait({self._lifespan, started}, return_when=asyncio.FIRST_COMPLETED)
        if started not in done:
            raise RuntimeError("the app's lifespan ended before it started")
        started.result()

    async def shutdown(self, timeout: float = 10.0) -> None:
        if self._lifespan is None or self._lifespan.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._lifespan, timeout)

    async def stream(
        self,
        method: str,
        path: str,
        query: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes = b"",
        client: tuple[str, int] | None = None,
    ) -> AsyncIterator[dict[str, Any] | bytes]:
        """The response: one ``{"status": int, "headers": [(name, value), ...]}``, then body chunks."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method.upper(),
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("latin-1", "replace"),
            "root_path": "",
            "query_string": query,
            "headers": list(headers or []),
            "client": client or ("127.0.0.1", 0),
            "server": ("127.0.0.1", 80),
            "state": dict(self._state),
        }
        out: asyncio.Queue[Any] = asyncio.Queue()
        disconnected = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            await out.put(msg)

        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: out.put_nowait(_DONE))
        started = False
        try:
            while True:
                msg = await out.get()
                if msg is _DONE:
                    if not started:  # the app ended without answering (an exception it did not handle)
                        yield {"status": 500, "headers": [(b"content-type", b"application/json")]}
                        yield b'{"error":{"message":"the server failed to answer","type":"server_error","code":500}}'
                    return
                if msg["type"] == "http.response.start":
                    started = True
                    yield {"status": int(msg["status"]), "headers": list(msg.get("headers", []))}
                elif msg["type"] == "http.response.body":
                    if msg.get("body"):
                        yield bytes(msg["body"])
                    if not msg.get("more_body", False):
                        return
        finally:
            disconnected.set()  # the reader is gone or done: the app sees a disconnect and stops generating
            if not task.done():
                asyncio.get_running_loop().call_later(10.0, task.cancel)
