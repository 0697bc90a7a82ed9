"""The server as an MCP host, over a real socket: a stdio MCP server written with the SDK
(:mod:`tests.server.mcp_tools_server`), the agent loop through the official ``openai`` client on the
scripted fake model (its tool calls are scripted, parsed by the server's Hermes parser), broken MCP
servers next to it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server.mcp_fake import last_user, tool_call, tool_responses
from tests.server.mcp_live import SECRET_VAR, config, mcp_server, wait_tools

MAX_STEPS = 3


def script(prompt: str) -> str:
    """The scripted model: what it answers depends on the user's last message and the tool results."""
    user, results = last_user(prompt), tool_responses(prompt)
    if user == "add 2 3":
        return f"The sum is {results[-1]}." if results else tool_call("add", a=2, b=3)
    if user == "fail":
        return f"The tool said: {results[-1]}" if results else tool_call("fail", reason="testing")
    if user == "slow":
        return f"Result: {results[-1]}" if results else tool_call("slow", seconds=30)
    if user == "loop":
        return tool_call("add", a=len(results), b=1)
    if user == "env":
        if len(results) == 2:
            return " | ".join(results)
        return tool_call("getenv", name="GIVEN" if not results else SECRET_VAR)
    if user == "crash":
        return f"After the crash: {results[-1]}" if results else tool_call("crash")
    return "Hello!"


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator:
    path = config(tmp_path_factory.mktemp("mcp"))
    with mcp_server(path, script, mcp_max_steps=MAX_STEPS) as s:
        wait_tools(s.base_url)
        yield s


@pytest.fixture(scope="module")
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=60)


def ask(client: openai.OpenAI, text: str, mcp=True, **kw):
    return client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": text}], extra_body={"mcp": mcp}, **kw
    )


def test_tools_listed_and_broken_servers_reported(srv):
    body = httpx.get(srv.base_url + "/mcp/tools").json()
    assert {"add", "fail", "slow", "getenv", "crash"} <= {t["name"] for t in body["tools"]}
    add = next(t for t in body["tools"] if t["name"] == "add")
    assert add["server"] == "tools" and add["input_schema"]["properties"]["a"]["type"] == "integer"
    st = {s["name"]: s for s in body["servers"]}
    assert st["tools"]["state"] == "ready" and st["tools"]["transport"] == "stdio"
    # a server that crashes at start and one that cannot be run: reported with the reason
    assert st["broken"]["state"] in ("failed", "starting")
    assert "crashing on purpose at start" in st["broken"]["error"]
    assert "cannot run" in st["missing"]["error"] and "No such file" in st["missing"]["error"]
    assert body["max_steps"] == MAX_STEPS and body["confirm"] is False
    assert httpx.get(srv.base_url + "/health").status_code == 200  # and the server serves


def test_agent_calls_the_tool_and_answers(srv, client):
    n0 = len(srv.backend.prompts)
    t0 = time.monotonic()
    r = ask(client, "add 2 3")
    choice = r.choices[0]
    assert choice.message.content == "The sum is 5." and choice.finish_reason == "stop"
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    results = choice.message.model_extra["mcp_tool_results"]
    assert results == [{"tool_call_id": calls[0].id, "name": "add", "content": "5", "is_error": False}]
    # the model saw the tools and, in its second step, the result
    prompts = srv.backend.prompts[n0:]
    assert len(prompts) == 2 and '"name": "add"' in prompts[0]
    assert "<tool_response>5</tool_response>" in prompts[1]
    assert r.usage.prompt_tokens > 0 and r.model_extra["mcp_steps"] == 2
    print(f"agent answer in {time.monotonic() - t0:.2f} s")


def test_streamed_steps_reassemble(srv, client):
    from openai.lib.streaming.chat import ChatCompletionStreamState

    plain = ask(client, "add 2 3").choices[0].message
    state, order = ChatCompletionStreamState(), []
    stream = ask(client, "add 2 3", stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        state.handle_chunk(chunk)
        for ch in chunk.choices:
            d = ch.delta
            if d.tool_calls:
                order.append("call")
            if (d.model_extra or {}).get("mcp_tool_results"):
                order.append("result")
            if d.content:
                order.append("content")
    final = state.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == plain.content == "The sum is 5."
    assert final.choices[0].finish_reason == "stop" and final.usage.total_tokens > 0
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        (c.function.name, c.function.arguments) for c in plain.tool_calls
    ]
    results = msg.model_extra["mcp_tool_results"]
    assert [(r["tool_call_id"], r["content"], r["is_error"]) for r in results] == [
        (msg.tool_calls[0].id, "5", False)
    ]
    # the call, then its result, then the answer
    first = {k: order.index(k) for k in ("call", "result", "content")}
    assert first["call"] < first["result"] < first["content"]


def test_failing_tool_error_reaches_the_model(srv, client):
    r = ask(client, "fail")
    m = r.choices[0].message
    res = m.model_extra["mcp_tool_results"][0]
    assert res["is_error"] and "the fail tool failed: testing" in res["content"]
    assert m.content == f"The tool said: {res['content']}"


def test_slow_tool_times_out_as_a_result(srv, client):
    t0 = time.monotonic()
    r = ask(client, "slow")
    took = time.monotonic() - t0
    res = r.choices[0].message.model_extra["mcp_tool_results"][0]
    assert res["is_error"] and "did not answer within 2 s" in res["content"]
    assert r.choices[0].message.content.startswith("Result: error:")
    assert took < 20, took  # the tool sleeps 30 s; the call timeout is 2 s
    print(f"slow tool: answered in {took:.2f} s")


def test_step_limit_stops_a_model_that_keeps_calling(srv, client):
    n0 = len(srv.backend.prompts)
    r = ask(client, "loop")
    choice = r.choices[0]
    assert len(srv.backend.prompts) - n0 == MAX_STEPS
    assert choice.finish_reason == "length" and choice.model_extra["mcp_stop"] == "max_steps"
    results = choice.message.model_extra["mcp_tool_results"]
    assert [x["content"] for x in results[:-1]] == ["1", "2"]
    assert results[-1]["is_error"] and "limit of 3 steps" in results[-1]["content"]
    assert len(choice.message.tool_calls) == MAX_STEPS


def test_mcp_servers_get_only_the_configured_environment(srv, client):
    got = ask(client, "env").choices[0].message.content
    assert got == "from the config | (unset)"


def test_allowed_tools_and_bad_requests(srv, client):
    n0 = len(srv.backend.prompts)
    r = ask(client, "add 2 3", mcp=["add"])
    assert r.choices[0].message.content == "The sum is 5."
    offered = srv.backend.prompts[n0]
    assert '"name": "add"' in offered and '"name": "slow"' not in offered  # only the allowed tool
    # a tool the request does not allow is never run: the tools grammar lets the model call only "add"
    r = ask(client, "slow", mcp=["add"])
    assert [x["name"] for x in r.choices[0].message.model_extra["mcp_tool_results"]] == ["add"]
    with pytest.raises(openai.BadRequestError, match="no MCP tool named 'nope'"):
        ask(client, "hi", mcp=["nope"])
    with pytest.raises(openai.BadRequestError, match="'mcp' must be true, false or a list"):
        ask(client, "hi", mcp="yes")
    with pytest.raises(openai.BadRequestError, match="not both"):
        ask(client, "hi", tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.BadRequestError, match='only "auto"'):
        ask(client, "hi", tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="'n' must be 1"):
        ask(client, "hi", n=2)
    assert ask(client, "hi", mcp=False).choices[0].message.content == "Hello!"
    assert ask(client, "hi", mcp=[]).choices[0].message.content == "Hello!"


def _stream_lines(base_url: str, text: str, on_chunk) -> list[dict]:
    """The chunks of a streamed agent answer (raw SSE over httpx); ``on_chunk(chunk)`` for each."""
    body = {"messages": [{"role": "user", "content": text}], "stream": True, "mcp": True}
    chunks = []
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                if on_chunk(chunks[-1]) is False:
                    break
    return chunks


@pytest.mark.parametrize("allow", [True, False])
def test_confirm_before_each_call(srv, client, allow):
    st = srv.app.state.mcp
    st.confirm = True  # as --mcp-confirm (this test only)
    asked = []

    def on_chunk(c):
        for ch in c["choices"]:
            for conf in ch["delta"].get("mcp_confirm") or []:
                asked.append(conf)
                r = httpx.post(srv.base_url + "/mcp/confirm", json={"id": conf["id"], "allow": allow})
                assert r.status_code == 200 and r.json() == {"id": conf["id"], "allow": allow}
                again = httpx.post(srv.base_url + "/mcp/confirm", json={"id": conf["id"], "allow": allow})
                assert (
                    again.status_code == 404 and "no MCP tool call waits" in again.json()["error"]["message"]
                )

    try:
        chunks = _stream_lines(srv.base_url, "add 2 3", on_chunk)
        assert httpx.get(srv.base_url + "/mcp/tools").json()["confirm"] is True
        with pytest.raises(openai.BadRequestError, match="give 'stream': true"):
            ask(client, "add 2 3")  # nobody could be asked
        for bad in ({"allow": True}, {"id": "x", "allow": "yes"}):
            r = httpx.post(srv.base_url + "/mcp/confirm", json=bad)
            assert r.status_code == 400, r.text
    finally:
        st.confirm = False
    assert [(a["name"], json.loads(a["arguments"])) for a in asked] == [("add", {"a": 2, "b": 3})]
    results = [r for c in chunks for ch in c["choices"] for r in ch["delta"].get("mcp_tool_results") or []]
    content = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    if allow:
        assert results[0]["content"] == "5" and content == "The sum is 5."
    else:
        assert results[0]["is_error"] and "declined" in results[0]["content"]
        assert content == f"The sum is {results[0]['content']}."


def test_client_leaving_while_a_call_waits(srv):
    st = srv.app.state.mcp
    st.confirm = True
    try:
        chunks = _stream_lines(
            srv.base_url, "add 2 3", lambda c: not c["choices"][0]["delta"].get("mcp_confirm")
        )
        assert chunks[-1]["choices"][0]["delta"]["mcp_confirm"]
        deadline = time.monotonic() + 10
        while len(st.confirmations):  # the left call is dropped, not left waiting
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        st.confirm = False
    assert httpx.get(srv.base_url + "/health").status_code == 200


def test_a_server_that_crashes_mid_call_is_restarted(srv, client):
    r = ask(client, "crash")
    res = r.choices[0].message.model_extra["mcp_tool_results"][0]
    assert res["is_error"] and "failed" in res["content"]
    assert r.choices[0].message.content.startswith("After the crash: error:")
    assert httpx.get(srv.base_url + "/health").status_code == 200
    deadline = time.monotonic() + 30
    while True:  # reported, then restarted by its supervisor
        st = {s["name"]: s for s in httpx.get(srv.base_url + "/mcp/tools").json()["servers"]}["tools"]
        if st["state"] == "ready" and st["restarts"] >= 1:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.1)
    assert ask(client, "add 2 3").choices[0].message.content == "The sum is 5."


def test_without_mcp_config(live):
    """A server started without --mcp-config: no tools, and "mcp" is a clear 400."""
    body = httpx.get(live.base_url + "/mcp/tools").json()
    assert body == {"servers": [], "tools": [], "confirm": False, "max_steps": 8}
    chat = {"messages": [{"role": "user", "content": "hi"}], "mcp": True}
    r = httpx.post(live.base_url + "/v1/chat/completions", json=chat)
    assert r.status_code == 400 and "runs no MCP servers" in r.json()["error"]["message"], r.text
    r = httpx.post(live.base_url + "/mcp/confirm", json={"id": "x", "allow": True})
    assert r.status_code == 404
    chat["mcp"] = False
    assert httpx.post(live.base_url + "/v1/chat/completions", json=chat).status_code == 200


def test_serve_refuses_a_bad_mcp_config(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "mcp.json"
    bad.write_text('{"mcpServers": {"web": {"url": "ftp://example.com"}}}')
    cmd = [
        sys.executable,
        "-m",
        "llamapy",
        "serve",
        "-m",
        str(tmp_path / "none.gguf"),
        "--mcp-config",
        str(bad),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == f"error: {bad}: mcpServers.web.url must be an http:// or https:// URL"
