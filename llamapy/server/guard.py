"""ASGI middleware in front of the app: API key (401) and request body size (413) checks.

The body is read here, up to the limit, and replayed to the app; a larger body (by Content-Length, or
counted while streaming in) is refused before the app sees it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
ANTHROPIC_PREFIX = "/v1/messages"  # errors under it get Anthropic's error shape
OLLAMA_PREFIX = "/api/"  # and ollama's under it
KEY_ID = "api_key_id"  # scope["state"][KEY_ID]: which API key authorized the request (see key_id)


def _public(path: str) -> bool:
    """Health checks and the chat page with its files (it asks for the key itself) need no API key."""
    from .webui import is_public

    return path in PUBLIC_PATHS or is_public(path)


def key_id(key: bytes) -> str:
    """Who a request is, for what it stores (responses): a digest of its API key, never the key."""
    return hashlib.sha256(b"llamapy-api-key:" + key).hexdigest()[:32]


def request_key_id(scope: Scope) -> str | None:
    """The :func:`key_id` of the key a request was authorized with (None: the server has no keys)."""
    state = scope.get("state")
    return state.get(KEY_ID) if isinstance(state, dict) else None


class GuardMiddleware:
    def __init__(
        self, app: ASGIApp, api_keys: list[str] | None = None, max_body_bytes: int = 8 << 20
    ) -> None:
        self.app = app
        self.api_keys = [k.encode() for k in (api_keys or []) if k]
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        anthropic = scope["path"].startswith(ANTHROPIC_PREFIX)
        anthropic = "ollama" if scope["path"].startswith(OLLAMA_PREFIX) else anthropic  # {"error": msg}
        if self.api_keys:  # a fresh state dict: what the app reads there comes from here, not the server
            scope["state"] = {**(scope.get("state") or {}), KEY_ID: None}
        if self.api_keys and scope["method"] != "OPTIONS" and not _public(scope["path"]):
            matched = self._authorized(headers)
            if matched is None:
                why = (
                    "missing" if not (headers.get("authorization") or headers.get("x-api-key")) else "invalid"
                )
                await _reply(
                    send,
                    401,
                    f"{why} API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                    "authentication_error",
                    anthropic=anthropic,
                )
                return
            scope["state"][KEY_ID] = key_id(matched)
        length = headers.get("content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                await _reply(send, 400, f"invalid Content-Length header {length!r}", anthropic=anthropic)
                return
            if n > self.max_body_bytes:
                await _reply(send, 413, self._too_large(n), anthropic=anthropic)
                return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await _reply(send, 413, self._too_large(size, at_least=True), anthropic=anthropic)
                return
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _authorized(self, headers: dict[str, bytes]) -> bytes | None:
        """The key sent as ``Authorization: Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY``
        (Anthropic clients) if it is one of ours (every key compared, in constant time), else None."""
        auth = headers.get("authorization", b"")
        given = [
            auth[7:].strip() if auth[:7].lower() == b"bearer " else b"",
            headers.get("x-api-key", b"").strip(),
        ]
        matched = None
        for g in given:
            for k in self.api_keys:
                if hmac.compare_digest(g, k) and g and matched is None:
                    matched = k
        return matched

    def _too_large(self, n: int, at_least: bool = False) -> str:
        return (
            f"request body too large: {'more than ' if at_least else ''}{n} bytes, "
            f"the limit is {self.max_body_bytes} bytes"
        )


async def _reply(
    send: Send, status: int, message: str, type: str | None = None, anthropic: bool | str = False
) -> None:
    err = error_body(status, message, type)
    if anthropic == "ollama":  # ollama's shape: {"error": "message"}
        err = {"error": message}
    elif anthropic:  # Anthropic's shape: {"type": "error", "error": {"type", "message"}}
        err = {"type": "error", "error": {"type": err["error"]["type"], "message": message}}
    body = json.dumps(err).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
