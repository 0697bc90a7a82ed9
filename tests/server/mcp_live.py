"""Servers for the MCP tests: the app over the scripted fake model (:mod:`tests.server.mcp_fake`) with an
``mcpServers`` config holding the test MCP server (:mod:`tests.server.mcp_tools_server`) and, optionally,
servers that crash at start or cannot be run at all."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from fastapi import Request

from llamapy.server.app import ServerSettings
from tests.server.conftest import LiveServer, start_live, stop_live, wait_ready
from tests.server.mcp_fake import ScriptedBackend

TOOLS_SERVER = str(Path(__file__).with_name("mcp_tools_server.py"))
SECRET_VAR = "LLAMAPY_MCP_TEST_SECRET"  # set in the server's environment: no MCP server may see it


def config(tmp: Path, broken: bool = True, call_timeout: float = 2.0) -> Path:
    servers: dict[str, object] = {
        "tools": {
            "command": sys.executable,
            "args": [TOOLS_SERVER],
            "env": {"GIVEN": "from the config"},
            "timeout": call_timeout,
        }
    }
    if broken:
        servers["broken"] = {"command": sys.executable, "args": [TOOLS_SERVER, "crash"]}
        servers["missing"] = {"command": str(tmp / "no-such-mcp-server")}
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def _settings(path: Path, **kw) -> ServerSettings:
    s = ServerSettings(model_path="/models/fake.gguf", max_body_bytes=1 << 20)
    for k, v in {"mcp_config": str(path), **kw}.items():
        setattr(s, k, v)  # (fields of ServerSettings once --mcp-config is wired in)
    return s


def _wire(app, settings) -> None:  # pragma: no cover - until app.py/openai_api.py call mcp_http themselves
    """Until the app wires the MCP host in itself: its lifespan, routes and the chat hook."""
    from contextlib import asynccontextmanager

    from llamapy.server import mcp_http

    if any(getattr(r, "path", "") == "/mcp/tools" for r in app.routes):
        return
    orig = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        async with orig(a):
            await mcp_http.start(a, settings)
            yield
            await mcp_http.stop(a)

    app.router.lifespan_context = lifespan
    mcp_http.add_routes(app)
    chat = next(r for r in app.routes if getattr(r, "path", "") == "/v1/chat/completions")
    from llamapy.server.inputs import read_body
    from llamapy.server.schemas import ChatCompletionRequest

    async def hook(request: Request):
        req = await read_body(request, ChatCompletionRequest)
        if mcp_http.requested(req):
            m = await request.app.state.server.pick(request)
            m.ready()
            return await mcp_http.chat(request, m, req)
        return await chat.endpoint(request)

    app.router.add_api_route("/v1/chat/completions", hook, methods=["POST"])
    app.router.routes.insert(0, app.router.routes.pop())


@contextmanager
def mcp_server(path: Path, script, **settings) -> Iterator[LiveServer]:
    import os

    import tests.server.conftest as c
    from llamapy.server import app as app_mod

    backend = ScriptedBackend(script, n_ctx=16384, n_seq_max=2, n_batch=256)
    s = _settings(path, **settings)
    orig = app_mod.create_app

    def create(*a, **kw):
        app = orig(*a, **kw)
        _wire(app, s)
        return app

    os.environ[SECRET_VAR] = "must-not-leak"  # while the MCP servers start (and restart)
    c.create_app = create  # type: ignore[attr-defined]
    try:
        srv, thread = start_live(s, backend)
    finally:
        c.create_app = orig  # type: ignore[attr-defined]
    try:
        wait_ready(srv.base_url)
        yield srv
    finally:
        stop_live(srv, thread)
        os.environ.pop(SECRET_VAR, None)


def wait_tools(base_url: str, server: str = "tools", timeout: float = 30.0) -> dict:
    """/mcp/tools once ``server`` is ready."""
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(base_url + "/mcp/tools", timeout=10).json()
        st = {s["name"]: s for s in body["servers"]}
        if st.get(server, {}).get("state") == "ready":
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"the MCP server {server!r} is not ready: {body}")
        time.sleep(0.1)
