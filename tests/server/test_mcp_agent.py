"""The MCP agent loop against a scripted step function and fake tools (no model, no MCP server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from llamapy.server.mcp_agent import STEP_SEPARATOR, AgentEvent, Confirmations, StepResult, run_agent
from llamapy.server.mcp_host import ToolOutcome

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def call(name: str, args: Any, cid: str = "", index: int = 0) -> dict[str, Any]:
    raw = args if isinstance(args, str) else json.dumps(args)
    return {
        "index": index,
        "id": cid or None,
        "type": "function",
        "function": {"name": name, "arguments": raw},
    }


class Script:
    """A step function: answer i of the list (a content string, or a list of calls) at step i; it
    records the conversations it was given."""

    def __init__(self, *answers: str | list[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.seen: list[list[dict[str, Any]]] = []

    async def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]):
        self.seen.append([dict(m) for m in messages])
        a = self.answers[min(len(self.seen) - 1, len(self.answers) - 1)]
        if isinstance(a, str):
            for piece in (a[: len(a) // 2], a[len(a) // 2 :]):
                yield {"content": piece}
            yield StepResult({"role": "assistant", "content": a}, "stop", 10, len(a))
            return
        for c in a:  # a call in two pieces, as a parser streams it
            first = {k: v for k, v in c.items() if k != "function"}
            yield {"tool_calls": [{**first, "function": {"name": c["function"]["name"], "arguments": ""}}]}
            yield {
                "tool_calls": [{"index": c["index"], "function": {"arguments": c["function"]["arguments"]}}]
            }
        msg = {"role": "assistant", "content": None, "tool_calls": [{k: v for k, v in c.items() if k != "index"}
               for c in a]}  # fmt: skip
        yield StepResult(msg, "tool_calls", 10, 5)


class Tools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, args: dict[str, Any]) -> ToolOutcome:
        self.calls.append((name, args))
        if name == "add":
            return ToolOutcome(str(args["a"] + args["b"]))
        return ToolOutcome(f"error: no tool named {name!r}", True)


async def collect(agen) -> list[AgentEvent]:
    return [e async for e in agen]


def run(coro):
    return asyncio.run(coro)


def reassemble(events: list[AgentEvent]) -> dict[str, Any]:
    from openai.lib.streaming._deltas import accumulate_delta

    acc: dict[str, Any] = {}
    for e in events:
        if e.kind == "delta":
            accumulate_delta(acc, json.loads(json.dumps(e.data)))
        elif e.kind == "tool_result":
            accumulate_delta(acc, {"mcp_tool_results": [dict(e.data)]})
    return acc


def test_answer_without_a_call_is_one_step():
    script, tools = Script("Hello there"), Tools()
    ev = run(collect(run_agent(script, tools, [{"role": "user", "content": "hi"}], TOOLS)))
    assert [e.kind for e in ev] == ["delta", "delta", "done"]
    done = ev[-1].data
    assert done["message"] == {"role": "assistant", "content": "Hello there"}
    assert done["finish_reason"] == "stop" and done["steps"] == 1 and not tools.calls


def test_call_result_and_answer_reassemble():
    script = Script([call("add", {"a": 2, "b": 3}, "c1")], "The sum is 5.")
    tools = Tools()
    ev = run(collect(run_agent(script, tools, [{"role": "user", "content": "2+3?"}], TOOLS)))
    kinds = [e.kind for e in ev]
    assert kinds == ["delta", "delta", "tool_result", "delta", "delta", "done"]
    assert tools.calls == [("add", {"a": 2, "b": 3})]
    # the second step saw the call and its result
    convo = script.seen[1]
    assert convo[1]["role"] == "assistant" and convo[1]["tool_calls"][0]["id"] == "c1"
    assert convo[2] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    done = ev[-1].data
    msg = done["message"]
    assert msg["content"] == "The sum is 5." and done["finish_reason"] == "stop" and done["steps"] == 2
    assert msg["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert msg["mcp_tool_results"] == [
        {"tool_call_id": "c1", "name": "add", "content": "5", "is_error": False}
    ]
    assert done["usage"]["prompt_tokens"] == 20
    # the streamed pieces make the same message
    acc = reassemble(ev)
    assert acc["content"] == msg["content"]
    assert [{k: v for k, v in c.items() if k != "index"} for c in acc["tool_calls"]] == msg["tool_calls"]
    assert [r["content"] for r in acc["mcp_tool_results"]] == ["5"]


def test_indices_count_over_steps_and_contents_are_separated():
    script = Script(
        [call("add", {"a": 1, "b": 1}, "a1"), call("add", {"a": 2, "b": 2}, "a2", 1)],
        [call("add", {"a": 3, "b": 3}, "b1")],
        "done",
    )
    # step 2's call has index 0 in its own step, and 2 in the answer
    ev = run(collect(run_agent(script, Tools(), [{"role": "user", "content": "go"}], TOOLS)))
    results = [e.data for e in ev if e.kind == "tool_result"]
    assert [(r["index"], r["content"]) for r in results] == [(0, "2"), (1, "4"), (2, "6")]
    acc = reassemble(ev)
    assert [c["id"] for c in acc["tool_calls"]] == ["a1", "a2", "b1"]
    assert acc["tool_calls"][2]["function"]["arguments"] == '{"a": 3, "b": 3}'


def test_separator_between_step_contents():
    script = Script([call("add", {"a": 1, "b": 1}, "a1")], "two")

    async def step(messages, tools):  # the first step writes content before its call
        if len(script.seen) == 0:
            script.seen.append(messages)
            yield {"content": "one"}
            c = call("add", {"a": 1, "b": 1}, "a1")
            yield {"tool_calls": [c]}
            yield StepResult({"role": "assistant", "content": "one", "tool_calls": [c]}, "tool_calls")
            return
        async for x in script(messages, tools):
            yield x

    ev = run(collect(run_agent(step, Tools(), [{"role": "user", "content": "go"}], TOOLS)))
    assert ev[-1].data["message"]["content"] == "one" + STEP_SEPARATOR + "two"
    assert reassemble(ev)["content"] == "one" + STEP_SEPARATOR + "two"


def test_step_limit_stops_a_model_that_keeps_calling():
    script, tools = Script([call("add", {"a": 1, "b": 2})]), Tools()
    ev = run(collect(run_agent(script, tools, [{"role": "user", "content": "loop"}], TOOLS, max_steps=3)))
    done = ev[-1].data
    assert len(script.seen) == 3 and done["steps"] == 3
    assert len(tools.calls) == 2  # the third step's call is not run
    assert done["finish_reason"] == "length" and done["mcp_stop"] == "max_steps"
    last = done["message"]["mcp_tool_results"][-1]
    assert last["is_error"] and "limit of 3 steps" in last["content"]
    assert len({c["id"] for c in done["message"]["tool_calls"]}) == 3  # ids made where the model gave none


def test_bad_arguments_and_unknown_tools_go_back_to_the_model():
    script = Script([call("add", "{not json", "x1"), call("nope", {}, "x2", 1)], "sorry")
    tools = Tools()
    ev = run(collect(run_agent(script, tools, [{"role": "user", "content": "q"}], TOOLS)))
    results = [e.data for e in ev if e.kind == "tool_result"]
    assert results[0]["is_error"] and "not valid JSON" in results[0]["content"]
    assert results[1]["is_error"] and "no tool named 'nope'" in results[1]["content"]
    assert tools.calls == [("nope", {})]  # the bad JSON never reached a tool
    assert script.seen[1][-1] == {"role": "tool", "tool_call_id": "x2", "content": results[1]["content"]}


@pytest.mark.parametrize("allow", [True, False, None])
def test_confirmations(allow):
    async def main():
        conf = Confirmations(timeout=0.3)
        script, tools = Script([call("add", {"a": 2, "b": 2}, "k")], "ok"), Tools()
        events = []
        async for e in run_agent(
            script, tools, [{"role": "user", "content": "q"}], TOOLS, confirmations=conf
        ):
            events.append(e)
            if e.kind == "confirm":
                assert e.data["name"] == "add" and e.data["tool_call_id"] == "k"
                assert not conf.answer("mcpc-unknown", True)
                if allow is not None:
                    assert conf.answer(e.data["id"], allow)
                    assert not conf.answer(e.data["id"], allow)  # answered once only
        assert len(conf) == 0
        return events, tools

    events, tools = run(main())
    res = next(e.data for e in events if e.kind == "tool_result")
    if allow:
        assert res["content"] == "4" and tools.calls
    else:  # declined, or no answer in time
        assert res["is_error"] and "declined" in res["content"] and not tools.calls
