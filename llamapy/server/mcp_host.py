"""The server as an MCP host: the MCP servers of ``--mcp-config``, started and supervised through the
official ``mcp`` SDK (``pip install 'llamapy[mcp]'``), their tools listed and called.

The config is the ``mcpServers`` JSON that Claude Desktop and others use::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                  "env": {"DEBUG": "1"}},
        "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer ..."}}}}

A stdio server runs with the ``env`` its entry gives plus the SDK's short list of variables needed to
run a program at all (``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``TERM``), never the rest of
the server's environment (no API keys, no ``HF_TOKEN``). llamapy's own keys in an entry: ``timeout``
(seconds a tool call may take, default 60), ``startTimeout`` (seconds to answer the handshake, default
30), ``disabled`` (true: skipped). A server is supervised by one task: a server that fails to start, or
stops answering (a ping every few seconds, or a call that finds the connection gone), is reported by
:meth:`McpHost.status` with the reason (and the tail of its stderr) and restarted with a growing delay
(1 s doubling up to 60 s); the HTTP server keeps serving either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import field
from pathlib import Path
from typing import Any

from .._dataclass import dataclass
from ..errors import LlamapyError

log = logging.getLogger("llamapy.server.mcp")

DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_START_TIMEOUT = 30.0
PING_INTERVAL = 5.0
RESTART_DELAY_MAX = 60.0
MAX_RESULT_CHARS = 16000  # a tool's answer is cut to this before it goes into the prompt
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_ENTRY_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout"}
_ENTRY_KEYS |= {"startTimeout", "disabled"}


class McpConfigError(LlamapyError, ValueError):
    """The ``--mcp-config`` file is missing, not JSON, or not an ``mcpServers`` map of valid entries."""


class McpUnavailableError(LlamapyError, RuntimeError):
    """The ``mcp`` package is not installed."""


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str | None = None  # stdio
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None  # streamable HTTP
    headers: dict[str, str] = field(default_factory=dict)
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


def _str_map(v: Any, where: str) -> dict[str, str]:
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise McpConfigError(f"{where} must be an object of strings")
    return dict(v)


def _seconds(v: Any, where: str, default: float) -> float:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 86400:
        raise McpConfigError(f"{where} must be a number of seconds in (0, 86400], got {v!r}")
    return float(v)


def parse_config(data: Any, source: str = "the MCP config") -> list[McpServerConfig]:
    """The servers of an ``{"mcpServers": {...}}`` object (disabled ones left out); McpConfigError."""
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError(f'{source}: expected an object with an "mcpServers" object')
    out = []
    for name, e in data["mcpServers"].items():
        where = f"{source}: mcpServers.{name}"
        if not _NAME.match(name):
            raise McpConfigError(f"{where}: a server name is 1-64 letters, digits, '_', '-' or '.'")
        if not isinstance(e, dict):
            raise McpConfigError(f"{where} must be an object")
        unknown = sorted(set(e) - _ENTRY_KEYS)
        if unknown:
            raise McpConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
        if e.get("disabled") is True:
            continue
        kind = e.get("type", e.get("transport"))
        if kind in ("sse",):
            raise McpConfigError(f"{where}: the SSE transport is not supported; use streamable HTTP")
        has_cmd, has_url = "command" in e, "url" in e
        if has_cmd == has_url:
            raise McpConfigError(f'{where}: give either "command" (stdio) or "url" (streamable HTTP)')
        timeouts = {
            "call_timeout": _seconds(e.get("timeout"), f"{where}.timeout", DEFAULT_CALL_TIMEOUT),
            "start_timeout": _seconds(e.get("startTimeout"), f"{where}.startTimeout", DEFAULT_START_TIMEOUT),
        }
        if has_cmd:
            cmd, args = e["command"], e.get("args", [])
            if not isinstance(cmd, str) or not cmd.strip():
                raise McpConfigError(f"{where}.command must be a non-empty string")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise McpConfigError(f"{where}.args must be a list of strings")
            cwd = e.get("cwd")
            if cwd is not None and not isinstance(cwd, str):
                raise McpConfigError(f"{where}.cwd must be a string")
            env = _str_map(e.get("env", {}), f"{where}.env")
            out.append(McpServerConfig(name, cmd, tuple(args), env, cwd, **timeouts))
        else:
            url = e["url"]
            if not isinstance(url, str) or not re.match(r"^https?://", url):
                raise McpConfigError(f"{where}.url must be an http:// or https:// URL")
            headers = _str_map(e.get("headers", {}), f"{where}.headers")
            out.append(McpServerConfig(name, url=url, headers=headers, **timeouts))
    return out


def load_config(path: str | os.PathLike[str]) -> list[McpServerConfig]:
    """The servers of the ``mcpServers`` JSON file at ``path``; McpConfigError with the reason."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise McpConfigError(f"cannot read the MCP config {str(path)!r}: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"the MCP config {str(path)!r} is not valid JSON: {e}") from None
    return parse_config(data, str(path))


def check_sdk() -> None:
    """McpUnavailableError when the ``mcp`` SDK cannot be imported."""
    try:
        import mcp.client.session  # noqa: F401
    except ImportError as e:
        raise McpUnavailableError(
            f"--mcp-config needs the MCP SDK: pip install 'llamapy[mcp]' ({e})"
        ) from None


@dataclass
class McpTool:
    """A tool as offered to the model (``name``; unique over all servers) and where it lives."""

    name: str
    server: str
    tool: str  # its name on its server
    description: str
    input_schema: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        params = self.input_schema if isinstance(self.input_schema, dict) else {}
        params = {"type": "object", "properties": {}, **params}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "server": self.server,
            "tool": self.tool,
            "description": self.description,
            "input_schema": self.input_schema,
        }


@dataclass
class ToolOutcome:
    """What a call gave: the text that goes to the model (role ``tool``) and whether it failed."""

    content: str
    is_error: bool = False


class _Server:
    def __init__(self, cfg: McpServerConfig) -> None:
        self.cfg = cfg
        self.state = "starting"  # "ready" | "failed" | "stopped"
        self.error: str | None = None
        self.restarts = 0
        self.tools: list[Any] = []  # mcp Tool objects
        self.session: Any = None
        self.started = asyncio.Event()  # set once the first attempt is decided (ready or failed)
        self.lost = asyncio.Event()  # a call found the connection gone
        self.relist = asyncio.Event()  # the server said its tool list changed
        self.since = time.time()

    def info(self) -> dict[str, Any]:
        return {
            "name": self.cfg.name,
            "transport": self.cfg.transport,
            "state": self.state,
            "error": self.error,
            "restarts": self.restarts,
            "tools": [t.name for t in self.tools] if self.state == "ready" else [],
        }


def _describe(e: BaseException) -> str:
    """One line for an exception (the leaves of an exception group)."""
    leaves = getattr(e, "exceptions", None)  # an exception group (anyio's task groups raise them)
    if isinstance(leaves, tuple) and leaves:
        return "; ".join(dict.fromkeys(_describe(x) for x in leaves))
    if isinstance(e, asyncio.TimeoutError) and not str(e).strip():
        return "timed out"
    msg = str(e).strip() or type(e).__name__
    return msg if type(e).__name__ in msg else f"{type(e).__name__}: {msg}"


class McpHost:
    """The MCP servers of one ``llamapy serve``: ``await start()`` in the app's lifespan (returns at once;
    each server starts in its own supervisor task), ``await stop()`` at its end."""

    def __init__(self, configs: list[McpServerConfig]) -> None:
        self.servers = {c.name: _Server(c) for c in configs}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        check_sdk()
        self._tmp = tempfile.TemporaryDirectory(prefix="llamapy-mcp-")
        for srv in self.servers.values():
            self._tasks.append(asyncio.create_task(self._supervise(srv), name=f"mcp:{srv.cfg.name}"))

    async def stop(self) -> None:
        self._stopping.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=15)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        for srv in self.servers.values():
            srv.state, srv.session = "stopped", None
        if self._tmp is not None:
            self._tmp.cleanup()

    async def wait_started(self, timeout: float | None = None) -> None:
        """Until every server's first start is decided (ready or failed), at most ``timeout`` seconds."""
        waits = [s.started.wait() for s in self.servers.values()]
        if waits:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)

    def status(self) -> dict[str, Any]:
        return {
            "servers": [s.info() for s in self.servers.values()],
            "tools": [t.info() for t in self.tools().values()],
        }

    def tools(self) -> dict[str, McpTool]:
        """The tools of the ready servers by the name the model sees: the tool's own name, or
        ``server__tool`` when two servers have a tool of that name."""
        pairs = [(s, t) for s in self.servers.values() if s.state == "ready" for t in s.tools]
        count: dict[str, int] = {}
        for _, t in pairs:
            count[t.name] = count.get(t.name, 0) + 1
        out: dict[str, McpTool] = {}
        for s, t in pairs:
            name = t.name if count[t.name] == 1 else f"{s.cfg.name}__{t.name}"
            out[name] = McpTool(name, s.cfg.name, t.name, t.description or "", dict(t.input_schema or {}))
        return out

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Run the tool the model calls ``name``; every failure (unknown tool, server down, timeout, the
        tool's own error) is an outcome with ``is_error``, never an exception."""
        tool = self.tools().get(name)
        if tool is None:
            return ToolOutcome(f"error: no tool named {name!r} is available", True)
        srv = self.servers[tool.server]
        session = srv.session
        if session is None:
            return ToolOutcome(f"error: the MCP server {srv.cfg.name!r} is not running ({srv.error})", True)
        timeout = srv.cfg.call_timeout
        try:
            result = await asyncio.wait_for(session.call_tool(tool.tool, arguments), timeout)
        except asyncio.TimeoutError:
            return ToolOutcome(f"error: the tool {name!r} did not answer within {timeout:g} s", True)
        except Exception as e:  # the connection died, a protocol error...
            srv.lost.set()
            return ToolOutcome(f"error: calling {name!r} failed: {_describe(e)}", True)
        return ToolOutcome(_result_text(result), bool(getattr(result, "is_error", False)))

    # -- supervision -------------------------------------------------------------------------------

    async def _supervise(self, srv: _Server) -> None:
        delay = 1.0
        while not self._stopping.is_set():
            t0 = time.monotonic()
            try:
                await self._run_once(srv)
            except BaseException as e:  # noqa: BLE001 (anyio groups; a cancel from stop() re-raised)
                if isinstance(e, asyncio.CancelledError) and self._stopping.is_set():
                    raise
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                if not self._stopping.is_set() and srv.state != "failed":  # (not reported yet)
                    self._failed(srv, e)
            finally:
                srv.session, srv.tools = None, []
                if not self._stopping.is_set():
                    srv.state = "failed"
                srv.started.set()
            if self._stopping.is_set():
                break
            if time.monotonic() - t0 > 2 * RESTART_DELAY_MAX:
                delay = 1.0  # it ran a good while: restart soon
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, RESTART_DELAY_MAX)
            if not self._stopping.is_set():
                srv.restarts += 1
                srv.state = "starting"

    def _failed(self, srv: _Server, e: BaseException) -> None:
        what = "failed to start" if srv.state != "ready" else "stopped answering"
        error = f"{what}: {_describe(e)}{self._stderr_tail(srv)}"
        repeated = error == srv.error  # (a server that keeps failing the same way is logged once)
        srv.error, srv.state, srv.session, srv.tools = error, "failed", None, []
        srv.started.set()
        log.log(logging.DEBUG if repeated else logging.WARNING, "MCP server %r %s", srv.cfg.name, error)

    def _errlog_path(self, srv: _Server) -> Path:
        assert self._tmp is not None
        return Path(self._tmp.name) / f"{srv.cfg.name}.stderr"

    def _stderr_tail(self, srv: _Server, n: int = 600) -> str:
        if srv.cfg.transport != "stdio" or self._tmp is None:
            return ""
        try:
            text = self._errlog_path(srv).read_text("utf-8", "replace").strip()
        except OSError:
            return ""
        text = " ".join(text[-4 * n :].split())[-n:]  # its last lines, on one line
        return f" (its stderr: ...{text})" if text else ""

    async def _run_once(self, srv: _Server) -> None:
        from mcp.client.session import ClientSession

        cfg = srv.cfg
        srv.lost.clear()
        srv.relist.clear()

        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                srv.relist.set()
            elif isinstance(message, Exception):  # the transport's: a ping tells whether it is gone
                srv.lost.set()

        async with contextlib.AsyncExitStack() as stack:
            if cfg.transport == "stdio":
                from mcp.client.stdio import StdioServerParameters, stdio_client

                errlog = stack.enter_context(open(self._errlog_path(srv), "w", encoding="utf-8"))  # noqa: SIM115
                params = StdioServerParameters(
                    command=cfg.command, args=list(cfg.args), env=cfg.env, cwd=cfg.cwd
                )
                try:
                    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
                except OSError as e:
                    raise RuntimeError(f"cannot run {cfg.command!r}: {e.strerror or e}") from None
            else:
                import httpx2
                from mcp.client.streamable_http import streamable_http_client

                http = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=cfg.headers, timeout=httpx2.Timeout(30.0, read=300.0))
                )
                read, write = await stack.enter_async_context(
                    streamable_http_client(cfg.url, http_client=http)
                )
            session = await stack.enter_async_context(ClientSession(read, write, message_handler=on_message))
            try:
                tools = await self._until_stopped(self._handshake(session), cfg.start_timeout)
            except BaseException as e:  # reported now: stopping the process may take a few seconds
                if isinstance(e, asyncio.TimeoutError):
                    e = TimeoutError(f"no answer to the MCP handshake within {cfg.start_timeout:g} s")
                if not self._stopping.is_set() and not isinstance(e, asyncio.CancelledError):
                    self._failed(srv, e)
                raise e from None
            srv.tools, srv.session, srv.state, srv.error = tools, session, "ready", None
            srv.since = time.time()
            srv.started.set()
            log.info("MCP server %r ready: %d tools", cfg.name, len(tools))
            await self._watch(srv, session)

    async def _until_stopped(self, coro: Any, timeout: float) -> Any:
        """``coro``'s result, TimeoutError after ``timeout`` s, CancelledError when stop() is called."""
        work = asyncio.ensure_future(coro)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({work, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not work.done():
                work.cancel()
                await asyncio.wait({work}, timeout=5)
        if not work.done() or work.cancelled():
            raise asyncio.CancelledError() if self._stopping.is_set() else asyncio.TimeoutError()
        return work.result()

    @classmethod
    async def _handshake(cls, session: Any) -> list[Any]:
        await session.initialize()
        return await cls._list_tools(session)

    @staticmethod
    async def _list_tools(session: Any) -> list[Any]:
        tools, cursor = [], None
        while True:
            if cursor is None:
                res = await session.list_tools()
            else:
                from mcp_types import PaginatedRequestParams

                res = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
            tools += res.tools
            cursor = res.next_cursor
            if not cursor:
                return tools

    async def _watch(self, srv: _Server, session: Any) -> None:
        """Returns when stop() is called; raises when the server stops answering. Lists the tools again
        when the server says they changed."""
        while not self._stopping.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self._stopping, srv.lost, srv.relist)]
            await asyncio.wait(waits, timeout=PING_INTERVAL, return_when="FIRST_COMPLETED")
            for w in waits:
                w.cancel()
            if self._stopping.is_set():
                return
            try:
                if srv.relist.is_set():
                    srv.relist.clear()
                    srv.tools = await asyncio.wait_for(self._list_tools(session), srv.cfg.start_timeout)
                    log.info("MCP server %r: tools changed, now %d", srv.cfg.name, len(srv.tools))
                else:
                    await asyncio.wait_for(session.send_ping(), 10)
            except Exception as e:
                raise ConnectionError(f"the connection is gone ({_describe(e)})") from None
            srv.lost.clear()


def _result_text(result: Any) -> str:
    """The text of a CallToolResult for the model: its text blocks, other blocks named, the structured
    result as JSON when there is no text; cut to :data:`MAX_RESULT_CHARS`."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}]")
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... {len(text) - MAX_RESULT_CHARS} more characters cut]"
    return text
