"""The MCP host without the HTTP server: the ``mcpServers`` config (every mistake named), and a server
over streamable HTTP (the test MCP server of :mod:`tests.server.mcp_tools_server` in HTTP mode)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest

from llamapy.server.mcp_host import McpConfigError, McpHost, load_config, parse_config
from tests.server.mcp_live import TOOLS_SERVER


def test_config_claude_desktop_shape(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "files": {"command": "npx", "args": ["-y", "srv", "/tmp"], "env": {"K": "v"}},
                    "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
                    "off": {"command": "x", "disabled": True},
                    "slow": {"type": "stdio", "command": "x", "timeout": 5, "startTimeout": 1.5},
                }
            }
        )
    )
    files, web, slow = load_config(path)
    assert (files.transport, files.command, files.args, files.env) == (
        "stdio",
        "npx",
        ("-y", "srv", "/tmp"),
        {"K": "v"},
    )
    assert (web.transport, web.url, web.headers) == (
        "http",
        "https://example.com/mcp",
        {"Authorization": "Bearer x"},
    )
    assert (slow.call_timeout, slow.start_timeout) == (5.0, 1.5)


@pytest.mark.parametrize(
    "data, message",
    [
        ([], '"mcpServers" object'),
        ({"servers": {}}, '"mcpServers" object'),
        ({"mcpServers": {"a": "npx"}}, "mcpServers.a must be an object"),
        ({"mcpServers": {"a": {}}}, 'either "command"'),
        ({"mcpServers": {"a": {"command": "x", "url": "http://h"}}}, 'either "command"'),
        ({"mcpServers": {"a": {"command": ""}}}, "command must be a non-empty string"),
        ({"mcpServers": {"a": {"command": "x", "args": "-v"}}}, "args must be a list of strings"),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, "env must be an object of strings"),
        ({"mcpServers": {"a": {"url": "ftp://h"}}}, "http:// or https://"),
        ({"mcpServers": {"a": {"url": "http://h", "type": "sse"}}}, "SSE transport is not supported"),
        ({"mcpServers": {"a": {"command": "x", "timeout": 0}}}, "timeout must be a number of seconds"),
        ({"mcpServers": {"a": {"command": "x", "startTimeout": True}}}, "startTimeout must be a number"),
        ({"mcpServers": {"a": {"command": "x", "cmd": "y"}}}, "unknown key(s) cmd"),
        ({"mcpServers": {"a b": {"command": "x"}}}, "a server name is"),
    ],
)
def test_config_mistakes_are_named(data, message):
    with pytest.raises(McpConfigError) as e:
        parse_config(data, "mcp.json")
    assert message in str(e.value) and str(e.value).startswith("mcp.json")


def test_config_file_errors(tmp_path):
    with pytest.raises(McpConfigError, match="cannot read the MCP config"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{mcpServers: 1")
    with pytest.raises(McpConfigError, match="is not valid JSON"):
        load_config(bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server_an_unreachable_one_and_one_that_never_answers():
    port, dead = _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, TOOLS_SERVER, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # until it listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.1)
        cfg = {
            "web": {"url": f"http://127.0.0.1:{port}/mcp", "timeout": 2},
            "gone": {"url": f"http://127.0.0.1:{dead}/mcp", "startTimeout": 5},
            "hang": {"command": sys.executable, "args": [TOOLS_SERVER, "hang"], "startTimeout": 1},
        }

        async def main():
            host = McpHost(parse_config({"mcpServers": cfg}))
            await host.start()
            try:
                await host.wait_started(30)
                st = {s["name"]: s for s in host.status()["servers"]}
                assert st["web"]["state"] == "ready" and st["web"]["transport"] == "http", st
                assert st["gone"]["state"] != "ready" and st["gone"]["error"], st
                assert "no answer to the MCP handshake within 1 s" in st["hang"]["error"], st
                added, slow = (
                    await host.call("add", {"a": 40, "b": 2}),
                    await host.call("slow", {"seconds": 10}),
                )
                assert "grown" not in host.tools()
                assert (await host.call("grow", {})).content == "added the tool grown"
                for _ in range(100):  # the server's list_changed notification: the tools are listed again
                    if "grown" in host.tools():
                        break
                    await asyncio.sleep(0.05)
                assert (await host.call("grown", {})).content == "grown here"
                return st, added, slow
            finally:
                await host.stop()

        st, added, slow = asyncio.run(main())
        assert (added.content, added.is_error) == ("42", False)
        assert slow.is_error and "did not answer within 2 s" in slow.content
        print("unreachable server:", st["gone"]["error"], "| silent server:", st["hang"]["error"])
    finally:
        proc.kill()  # (its event loop may still sleep in the slow tool)
        proc.wait(10)


def test_tool_names_unique_over_servers_and_results_as_text():
    import mcp_types as t

    from llamapy.server.mcp_host import MAX_RESULT_CHARS, _result_text

    host = McpHost(parse_config({"mcpServers": {"a": {"command": "x"}, "b": {"command": "y"}}}))
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    for name, tools in (("a", ["search", "only_a"]), ("b", ["search"])):
        srv = host.servers[name]
        srv.state, srv.tools = (
            "ready",
            [t.Tool(name=n, description=f"{n} of {name}", input_schema=schema) for n in tools],
        )
    tools = host.tools()
    assert sorted(tools) == ["a__search", "b__search", "only_a"]  # a name two servers share gets prefixed
    assert (tools["b__search"].server, tools["b__search"].tool) == ("b", "search")
    fn = tools["only_a"].openai()["function"]
    assert fn == {"name": "only_a", "description": "only_a of a", "parameters": schema}
    host.servers["b"].state = "failed"  # a failed server's tools are not offered
    assert sorted(host.tools()) == ["only_a", "search"]

    res = t.CallToolResult(
        content=[
            t.TextContent(type="text", text="hello"),
            t.ImageContent(type="image", data="AA==", mime_type="image/png"),
        ]
    )
    assert _result_text(res) == "hello\n[image image/png]"
    assert _result_text(t.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
    long = _result_text(
        t.CallToolResult(content=[t.TextContent(type="text", text="x" * (MAX_RESULT_CHARS + 5))])
    )
    assert long.endswith("[... 5 more characters cut]") and len(long) < MAX_RESULT_CHARS + 50
