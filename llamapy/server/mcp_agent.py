"""The agent loop of the MCP host: the model answers, its tool calls run through MCP, their results go
back to it, until it answers without a call or the step limit is reached.

The loop knows neither HTTP nor the engine. It drives a *step* callable, one chat completion over the
conversation so far (the server passes its own chat completion path, so there is one token loop), and a
*call_tool* callable (:meth:`McpHost.call`). It yields :class:`AgentEvent` s as things happen, for a
stream or for one final answer:

- ``delta``: an OpenAI chat-completion delta of the model's answer (``content``, ``reasoning_content``,
  ``tool_calls`` pieces). A step's tool calls are numbered after the earlier steps' calls (``index``
  counts over the whole answer), so the deltas of all steps reassemble into one message.
- ``confirm``: a call waits for the user's answer (``--mcp-confirm``): ``{"id", "index", "tool_call_id",
  "name", "arguments"}``; ``POST /mcp/confirm`` with that id answers it (:class:`Confirmations`).
- ``tool_result``: ``{"index", "tool_call_id", "name", "content", "is_error"}``, as each call ends. A
  tool's error, a timeout, an unknown tool, arguments that are not a JSON object, a declined call and a
  call left unrun at the step limit are all results with ``is_error`` (the model reads them), never
  exceptions.
- ``done`` (last): ``{"message", "finish_reason", "usage", "steps"}``: the whole answer as one message
  (all steps' content, every tool call and ``mcp_tool_results``); ``finish_reason`` is the last step's,
  or ``"length"`` with ``"mcp_stop": "max_steps"`` when the limit left calls unrun.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from .mcp_host import ToolOutcome

STEP_SEPARATOR = "\n\n"  # between the content of two steps


@dataclass
class StepResult:
    """The end of one chat step: its assistant message (OpenAI shape) and counts."""

    message: dict[str, Any]
    finish_reason: str | None = "stop"
    n_prompt: int = 0
    n_predicted: int = 0
    n_cached: int = 0


# step(messages, tools) yields OpenAI deltas (dicts) as the model writes, then one StepResult
Step = Callable[[list[dict[str, Any]], list[dict[str, Any]]], AsyncIterator[Any]]
CallTool = Callable[[str, dict[str, Any]], Awaitable[ToolOutcome]]


@dataclass
class AgentEvent:
    kind: str  # "delta" | "confirm" | "tool_result" | "done"
    data: dict[str, Any] = field(default_factory=dict)


class Confirmations:
    """Calls waiting for the user (``--mcp-confirm``): :meth:`open` gives an unguessable id before the
    stream announces the call, :meth:`answer` (``POST /mcp/confirm``) decides it; no answer within
    ``timeout`` seconds declines it."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = timeout
        self._pending: dict[str, asyncio.Future[bool]] = {}

    def open(self) -> str:
        cid = "mcpc-" + secrets.token_hex(16)
        self._pending[cid] = asyncio.get_running_loop().create_future()
        return cid

    async def wait(self, cid: str) -> bool:
        fut = self._pending[cid]
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            self._pending.pop(cid, None)

    def answer(self, cid: str, allow: bool) -> bool:
        """False when no call waits under ``cid`` (unknown, answered or timed out)."""
        fut = self._pending.get(cid)
        if fut is None or fut.done():
            return False
        fut.set_result(bool(allow))
        return True

    def __len__(self) -> int:
        return len(self._pending)


def _shift_indices(delta: dict[str, Any], base: int) -> dict[str, Any]:
    calls = delta.get("tool_calls")
    if not calls or not base:
        return delta
    return {**delta, "tool_calls": [{**c, "index": c.get("index", 0) + base} for c in calls]}


def _arguments(raw: Any) -> dict[str, Any] | str:
    """The call's arguments as an object, or the reason they are not one."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as e:
        return f"error: the arguments are not valid JSON ({e}); call the tool again with a JSON object"
    if not isinstance(value, dict):
        return "error: the arguments must be a JSON object"
    return value


async def run_agent(
    step: Step,
    call_tool: CallTool,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    max_steps: int = 8,
    confirmations: Confirmations | None = None,
) -> AsyncIterator[AgentEvent]:
    """The loop (see the module's doc). ``messages`` are OpenAI chat messages (dicts), ``tools`` the
    OpenAI ``tools`` offered to the model; ``confirmations``: ask before each call."""
    if max_steps < 1:
        raise ValueError("max_steps must be at least 1")
    convo = list(messages)
    contents: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    finish: str | None = "stop"
    stop_why: str | None = None
    n_steps = 0
    for n_steps in range(1, max_steps + 1):
        base = len(calls)
        # the steps' texts are joined with STEP_SEPARATOR, in the stream as in the final message
        sep = {"content": bool(contents), "reasoning_content": bool(reasoning)}
        result: StepResult | None = None
        async for item in step(convo, tools):
            if isinstance(item, StepResult):
                result = item
                continue
            delta = _shift_indices(item, base)
            for key, pending in sep.items():
                if pending and delta.get(key):
                    delta, sep[key] = {**delta, key: STEP_SEPARATOR + delta[key]}, False
            yield AgentEvent("delta", delta)
        if result is None:
            raise RuntimeError("the chat step ended without a result")
        msg = result.message
        usage["prompt_tokens"] += result.n_prompt
        usage["completion_tokens"] += result.n_predicted
        usage["cached_tokens"] += result.n_cached
        if msg.get("content"):
            contents.append(msg["content"])
        if msg.get("reasoning_content"):
            reasoning.append(msg["reasoning_content"])
        finish = result.finish_reason
        step_calls = []
        for i, c in enumerate(msg.get("tool_calls") or []):
            fn = c.get("function") or {}
            step_calls.append(
                {
                    "index": base + i,
                    "id": c.get("id") or f"call_{secrets.token_hex(8)}",
                    "type": "function",
                    "function": {"name": fn.get("name", ""), "arguments": fn.get("arguments") or "{}"},
                }
            )
        if not step_calls:
            break
        calls += step_calls
        convo.append(
            {
                "role": "assistant",
                "content": msg.get("content") or "",
                "tool_calls": [{k: v for k, v in c.items() if k != "index"} for c in step_calls],
            }
        )
        last = n_steps == max_steps
        for c in step_calls:
            name, cid = c["function"]["name"], c["id"]
            args = _arguments(c["function"]["arguments"])
            if last:
                outcome = ToolOutcome(f"not run: the limit of {max_steps} steps was reached", True)
            elif isinstance(args, str):
                outcome = ToolOutcome(args, True)
            else:
                allowed = True
                if confirmations is not None:
                    conf_id = confirmations.open()
                    info = {"id": conf_id, "index": c["index"], "tool_call_id": cid, "name": name}
                    yield AgentEvent("confirm", {**info, "arguments": c["function"]["arguments"]})
                    allowed = await confirmations.wait(conf_id)
                if allowed:
                    outcome = await call_tool(name, args)
                else:
                    outcome = ToolOutcome("error: the user declined this call", True)
            res = {
                "index": c["index"],
                "tool_call_id": cid,
                "name": name,
                "content": outcome.content,
                "is_error": outcome.is_error,
            }
            results.append(res)
            yield AgentEvent("tool_result", res)
            convo.append({"role": "tool", "tool_call_id": cid, "content": outcome.content})
        if last:
            finish, stop_why = "length", "max_steps"
            break
    message: dict[str, Any] = {"role": "assistant", "content": STEP_SEPARATOR.join(contents)}
    if reasoning:
        message["reasoning_content"] = STEP_SEPARATOR.join(reasoning)
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        message["mcp_tool_results"] = [{k: v for k, v in r.items() if k != "index"} for r in results]
    done: dict[str, Any] = {
        "message": message,
        "finish_reason": finish,
        "usage": usage,
        "steps": n_steps,
        "messages": convo[len(messages) :],
    }
    if stop_why:
        done["mcp_stop"] = stop_why
    yield AgentEvent("done", done)
