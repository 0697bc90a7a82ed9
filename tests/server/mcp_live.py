"""Servers for the MCP tests: the app over the scripted fake model (:mod:`tests.server.mcp_fake`) with an
``mcpServers`` config holding the test MCP server (:mod:`tests.server.mcp_tools_server`) and, optionally,
servers that crash at start or cannot be run at all."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

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


@contextmanager
def mcp_server(path: Path, script, **settings) -> Iterator[LiveServer]:
    """The app over the scripted model with ``--mcp-config path`` (and other ServerSettings)."""
    backend = ScriptedBackend(script, n_ctx=16384, n_seq_max=2, n_batch=256)
    s = ServerSettings(
        model_path="/models/fake.gguf", max_body_bytes=1 << 20, mcp_config=str(path), **settings
    )
    os.environ[SECRET_VAR] = "must-not-leak"  # while the MCP servers start (and restart)
    try:
        srv, thread = start_live(s, backend)
        try:
            wait_ready(srv.base_url)
            yield srv
        finally:
            stop_live(srv, thread)
    finally:
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
