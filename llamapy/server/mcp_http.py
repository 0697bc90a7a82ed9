"""The MCP host over HTTP: its lifecycle in the app's lifespan, ``GET /mcp/tools``, ``POST /mcp/confirm``,
and ``/v1/chat/completions`` with ``"mcp"`` (the agent loop of :mod:`.mcp_agent` over the server's own
chat completion path, as one answer or one stream). The stream format is in ``docs/interfaces.md``.

A request opts in with ``"mcp": true`` (every tool of the ready MCP servers) or ``"mcp": ["name", ...]``
(only those); ``false``, ``null`` or ``[]`` is a plain chat request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request

from .errors import APIError, bad_request
from .mcp_agent import AgentEvent, Confirmations, StepResult, run_agent
from .mcp_host import McpHost, McpTool, ToolOutcome, load_config

log = logging.getLogger("llamapy.server.mcp")

DEFAULT_MAX_STEPS = 8
WAIT_STARTING = 10.0  # a request waits this long at most for MCP servers still starting


class McpState:
    """What the app keeps: the host (None without ``--mcp-config``), the step limit, confirmations."""

    def __init__(
        self, host: McpHost | None, max_steps: int = DEFAULT_MAX_STEPS, confirm: bool = False
    ) -> None:
        self.host = host
        self.max_steps = max_steps
        self.confirm = confirm
        self.confirmations = Confirmations()


def _mcp_state(app: Any) -> McpState:
    st = getattr(app.state, "mcp", None)
    return st if isinstance(st, McpState) else McpState(None)


async def start(app: FastAPI, settings: Any) -> None:
    """In the lifespan, before serving: start the servers of ``settings.mcp_config`` (if any). They start
    in the background; one that fails is reported by ``/mcp/tools`` and the log, never stops the app."""
    path = getattr(settings, "mcp_config", None)
    max_steps = int(getattr(settings, "mcp_max_steps", DEFAULT_MAX_STEPS) or DEFAULT_MAX_STEPS)
    host = McpHost(load_config(path)) if path else None
    app.state.mcp = McpState(host, max_steps, bool(getattr(settings, "mcp_confirm", False)))
    if host is not None:
        await host.start()


async def stop(app: FastAPI) -> None:
    st = _mcp_state(app)
    if st.host is not None:
        await st.host.stop()


def add_routes(app: FastAPI, state: Any = None) -> None:
    @app.get("/mcp/tools")
    async def mcp_tools(request: Request) -> dict[str, Any]:
        st = _mcp_state(request.app)
        body: dict[str, Any] = {"servers": [], "tools": []}
        if st.host is not None:
            body = st.host.status()
        return {**body, "confirm": st.confirm, "max_steps": st.max_steps}

    @app.post("/mcp/confirm")
    async def mcp_confirm(request: Request) -> dict[str, Any]:
        from .schemas import parse_json

        body = parse_json(await request.body())
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise bad_request('expected {"id": "<the mcp_confirm id>", "allow": true|false}', "id")
        allow = body.get("allow")
        if not isinstance(allow, bool):
            raise bad_request("'allow' must be true or false", "allow")
        if not _mcp_state(request.app).confirmations.answer(body["id"], allow):
            raise APIError(404, f"no MCP tool call waits for a confirmation with id {body['id']!r}")
        return {"id": body["id"], "allow": allow}


# -- the chat route ------------------------------------------------------------------------------


def requested(req: Any) -> bool:
    """Whether a chat request asks for the agent loop: ``"mcp"`` true or a non-empty list of tool names
    (false, null, ``[]`` or no field: no); any other value is a 400."""
    v = (req.model_extra or {}).get("mcp")
    if v is None or isinstance(v, bool):
        return v is True
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise bad_request("'mcp' must be true, false or a list of MCP tool names", "mcp")
    return len(v) > 0


async def _tools(st: McpState, req: Any) -> list[McpTool]:
    if st.host is None:
        raise bad_request("'mcp': this server runs no MCP servers (start it with --mcp-config FILE)", "mcp")
    v = req.model_extra["mcp"]
    if any(s.state == "starting" and not s.started.is_set() for s in st.host.servers.values()):
        await st.host.wait_started(WAIT_STARTING)
    tools = st.host.tools()
    if v is True:
        return list(tools.values())
    unknown = [n for n in v if n not in tools]
    if unknown:
        have = ", ".join(sorted(tools)) or "none"
        raise bad_request(
            f"'mcp': no MCP tool named {', '.join(map(repr, unknown))} is available (GET /mcp/tools; "
            f"available: {have})",
            "mcp",
        )
    return [tools[n] for n in dict.fromkeys(v)]


def _check_request(req: Any, st: McpState) -> None:
    if req.tools or req.functions:
        raise bad_request(
            "give either 'tools' (run by the client) or 'mcp' (run by the server), not both", "mcp"
        )
    if req.tool_choice not in (None, "auto"):
        raise bad_request(
            "'tool_choice' with 'mcp': only \"auto\" (the model decides at each step)", "tool_choice"
        )
    if req.n not in (None, 1):
        raise bad_request("'n' must be 1 with 'mcp'", "n")
    if req.logprobs or req.top_logprobs:
        raise bad_request("'logprobs' are not available with 'mcp'", "logprobs")
    if st.confirm and not req.stream:
        raise bad_request(
            "this server asks before each MCP tool call (--mcp-confirm): give 'stream': true", "stream"
        )


def chat_step(m: Any, req: Any) -> Any:
    """The step function of the agent loop: one chat completion of model ``m`` over the messages so far,
    through the server's own path (``chat_inputs`` plans the prompt with the tools; the engine's token
    loop writes the answer; its parser splits it into content and tool calls)."""
    from ..api.chat_request import delta_dicts, message_dict
    from .inputs import chat_inputs
    from .schemas import ChatCompletionRequest, validate
    from .stream import TokenStream

    n_predict, name = req.max_tokens, "max_tokens"
    if req.max_completion_tokens is not None:
        n_predict, name = req.max_completion_tokens, "max_completion_tokens"
    drop = {"messages", "tools", "tool_choice", "stream", "stream_options", "n", "mcp"}
    base = {k: v for k, v in req.model_dump(exclude_none=True).items() if k not in drop}

    async def step(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> AsyncIterator[Any]:
        body = {**base, "messages": messages}
        if tools:
            body["tools"] = tools
        sreq = validate(ChatCompletionRequest, body)
        tokens, gp = await chat_inputs(sreq, m, n_predict, name)
        engine, _ = m.ready()
        ts = TokenStream(engine, tokens, gp)
        ts.start()
        try:
            text: list[str] = []
            while True:
                ev = await ts.next()
                text.append(ev.text)
                for d in delta_dicts(ev.deltas):
                    yield d
                if ev.done:
                    msg = message_dict(ev.message, "".join(text))
                    yield StepResult(msg, ev.finish_reason, ev.n_prompt, ev.n_predicted, ev.n_cached)
                    return
        finally:
            ts.close()

    return step


class _Chunks:
    """``chat.completion.chunk`` objects of an agent answer (see docs/interfaces.md)."""

    def __init__(self, model: str) -> None:
        from .formats import FINGERPRINT

        self.id, self.created, self.model = f"chatcmpl-{secrets.token_hex(12)}", int(time.time()), model
        self.fp = FINGERPRINT

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            **extra,
        }
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fp,
            "choices": [choice],
        }

    def event(self, e: AgentEvent) -> dict[str, Any] | None:
        if e.kind == "delta":
            return self.chunk(e.data) if e.data else None
        if e.kind == "tool_result":
            return self.chunk({"mcp_tool_results": [e.data]})
        if e.kind == "confirm":
            return self.chunk({"mcp_confirm": [e.data]})
        return None

    def final(self, done: dict[str, Any]) -> dict[str, Any]:
        extra = {"mcp_stop": done["mcp_stop"]} if "mcp_stop" in done else {}
        return self.chunk({}, done["finish_reason"], **extra)

    def usage_chunk(self, done: dict[str, Any]) -> dict[str, Any]:
        c = self.chunk({})
        c["choices"] = []
        c["usage"] = _usage(done)
        return c

    def response(self, done: dict[str, Any]) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": done["message"],
            "logprobs": None,
            "finish_reason": done["finish_reason"],
        }
        if "mcp_stop" in done:
            choice["mcp_stop"] = done["mcp_stop"]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fp,
            "choices": [choice],
            "usage": _usage(done),
            "mcp_steps": done["steps"],
        }


def _usage(done: dict[str, Any]) -> dict[str, Any]:
    u = done["usage"]
    return {
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["completion_tokens"],
        "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]},
    }


async def _watch(request: Request, task: asyncio.Task[Any]) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            task.cancel()
            return


async def chat(request: Request, m: Any, req: Any) -> Any:
    """``/v1/chat/completions`` with ``"mcp"``: the agent loop's answer, or its stream."""
    from .formats import SSE_DONE, JSONAnswer, sse
    from .stream import stream_response

    st = _mcp_state(request.app)
    _check_request(req, st)
    tools = await _tools(st, req)
    assert st.host is not None
    messages = [msg.model_dump(exclude_none=True) for msg in req.messages]
    host, allowed = st.host, {t.name for t in tools}

    async def call(name: str, arguments: dict[str, Any]) -> ToolOutcome:
        if name not in allowed:  # only the tools this request allows run
            return ToolOutcome(f"error: no tool named {name!r} is available", True)
        return await host.call(name, arguments)

    agent = run_agent(
        chat_step(m, req),
        call,
        messages,
        [t.openai() for t in tools],
        st.max_steps,
        st.confirmations if st.confirm else None,
    )
    out = _Chunks(m.name)
    if not req.stream:

        async def run() -> dict[str, Any]:
            async for e in agent:
                if e.kind == "done":
                    return e.data
            raise RuntimeError("the agent loop ended without an answer")

        task = asyncio.create_task(run())
        watcher = asyncio.create_task(_watch(request, task))
        try:
            done = await task
        except asyncio.CancelledError:
            if task.cancelled():
                raise APIError(499, "the client closed the request") from None
            raise
        finally:
            watcher.cancel()
        return JSONAnswer(out.response(done))

    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    # errors before the first event (a prompt over the context...) are plain HTTP errors
    try:
        first = await agent.__anext__()
    except BaseException:
        await agent.aclose()
        raise

    async def events() -> AsyncIterator[bytes]:
        try:
            yield sse(out.chunk({"role": "assistant", "content": None}))
            e: AgentEvent | None = first
            while e is not None:
                if e.kind == "done":
                    yield sse(out.final(e.data))
                    if include_usage:
                        yield sse(out.usage_chunk(e.data))
                    yield SSE_DONE
                    return
                c = out.event(e)
                if c is not None:
                    yield sse(c)
                e = await agent.__anext__()
        except APIError as err:
            yield sse(err.body())
        except StopAsyncIteration:
            return
        finally:
            with contextlib.suppress(Exception):
                await agent.aclose()

    return stream_response(events())
