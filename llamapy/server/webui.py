"""The chat page at ``/`` of ``llamapy serve`` (issue 28 §1).

The page is built from ``webui/`` in the repository (``npm run build`` there) into ``webui_dist/`` next to
this file, which ships inside the package: serving it needs no Node. :func:`mount_webui` puts ``/`` (and
``/index.html``) and the bundle's files under ``/webui/`` in front of the app's routes, so the page wins
over ollama's ``GET /`` ("Ollama is running"), and ``HEAD /`` still answers 200 for ollama clients. The
page and its files are public (the guard lets them through without an API key); the page asks for the
key itself and sends it with each API call.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import LlamapyError

BUNDLE_DIR = Path(__file__).with_name("webui_dist")
ASSETS_PREFIX = "/webui"
PUBLIC_PATHS = frozenset({"/", "/index.html"})  # and everything under ASSETS_PREFIX + "/"


class WebUIError(LlamapyError):
    """The page's folder cannot be served (no such folder, or no index.html in it)."""


def is_public(path: str) -> bool:
    """Whether a request path is the page or one of its files (served without an API key)."""
    return path in PUBLIC_PATHS or path.startswith(ASSETS_PREFIX + "/")


def _csp(html: str) -> str:
    """A Content-Security-Policy for the bundled page: its own scripts (and its one inline script, by
    hash) only, API calls to this server only, images from data:/blob: (attachments), KaTeX's inline
    styles. Model output is sanitized on the page; this is the second fence."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.encode()).digest()).decode() + "'"
        for m in re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    )
    return (
        f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
        "base-uri 'self'; frame-ancestors 'self'"
    )


class _Immutable:
    """Content-hashed files (``app-3F2A9C1B.js``) never change under their name: browsers keep them."""

    HASHED = re.compile(r"-[A-Z0-9]{8}\.(?:js|css)$")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.HASHED.search(scope.get("path", "")):
            await self.app(scope, receive, send)
            return

        async def send_cached(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 200:
                headers = MutableHeaders(scope=message)
                headers["Cache-Control"] = "public, max-age=31536000, immutable"
            await send(message)

        await self.app(scope, receive, send_cached)


def mount_webui(app: FastAPI, directory: str | Path | None = None) -> Path:
    """Serves the page folder ``directory`` (default: the bundled build) at ``/`` on ``app``, ahead of
    the routes already there. Returns the folder. Raises :class:`WebUIError` when it has no index.html."""
    folder = Path(directory).expanduser() if directory is not None else BUNDLE_DIR
    index = folder / "index.html"
    if not folder.is_dir():
        raise WebUIError(f"--webui-dir {folder}: not a folder")
    if not index.is_file():
        where = "the bundled page" if directory is None else f"--webui-dir {folder}"
        raise WebUIError(f"{where}: no index.html in {folder} (build it: cd webui && npm run build)")
    html = index.read_bytes()
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if directory is None:
        headers["Content-Security-Policy"] = _csp(html.decode("utf-8"))

    async def page(request: Request) -> Response:
        return Response(html, media_type="text/html; charset=utf-8", headers=headers)

    routes = [
        Route("/", page, methods=["GET", "HEAD"], name="webui"),
        Route("/index.html", page, methods=["GET", "HEAD"], name="webui_index"),
        Mount(
            ASSETS_PREFIX, app=GZipMiddleware(_Immutable(StaticFiles(directory=folder))), name="webui_assets"
        ),
    ]
    app.router.routes[:0] = routes
    return folder
