"""``--api-prefix``: every route (the API, the chat page and its files) served under a path prefix, as
llama-server's, which registers each path with the prefix in front: ``/PREFIX/v1/models``,
``/PREFIX/`` (the page); a path outside the prefix is a 404."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ApiPrefixMiddleware", "normalize_prefix"]


def normalize_prefix(prefix: str) -> str:
    """``"/api"`` from ``"api"``, ``"/api/"`` or ``"/api"``; ``""``: no prefix. Raises ValueError on a
    prefix that a URL path cannot start with (a query, a fragment, a space)."""
    p = prefix.strip("/")
    if not p:
        return ""
    if any(c in p for c in "?#% \t\r\n\\"):
        raise ValueError(f"--api-prefix {prefix!r}: not a URL path")
    return "/" + p


class ApiPrefixMiddleware:
    """Strips ``prefix`` from the requests under it, so the app's routes (and the middleware checking
    paths: the API keys' public paths, the error shapes) see the paths they were written with; a request
    elsewhere is a 404 in llama-server's error shape. The page's URLs are relative, so it works there."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if not path.startswith(self.prefix + "/"):
            await _not_found(scope, send)
            return
        scope = dict(scope, path=path[len(self.prefix) :])
        raw = scope.get("raw_path")
        if isinstance(raw, bytes) and raw.startswith(self.prefix.encode() + b"/"):
            scope["raw_path"] = raw[len(self.prefix) :]
        await self.app(scope, receive, send)


async def _not_found(scope: Scope, send: Send) -> None:
    from .errors import APIError

    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1000})
        return
    body = json.dumps(APIError(404, f"{scope['method']} {scope['path']}: no such endpoint").body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})
