"""A stdio MCP server for the tests, written with the official SDK: ``python mcp_tools_server.py [MODE]``.

Tools: ``add`` (a + b), ``fail`` (always raises: the error must reach the model as a tool result),
``slow`` (sleeps ``seconds`` then answers: the call timeout must stop it), ``getenv`` (a variable of its
environment, or ``(unset)``: what the host passes it), ``grow`` (adds the tool ``grown`` and says the
tool list changed) and ``crash`` (exits the process mid-call).
MODE ``crash``: exit at once with a message on stderr (an MCP server that crashes at start);
``hang``: never answer the handshake (one that never starts); ``http PORT``: serve streamable HTTP on
127.0.0.1:PORT (path ``/mcp``) instead of stdio.
"""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "crash":
        print("mcp_tools_server: crashing on purpose at start", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)

    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("llamapy-test-tools")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @server.tool()
    def fail(reason: str = "no reason") -> str:
        """A tool that always fails."""
        raise ToolError(f"the fail tool failed: {reason}")

    @server.tool()
    def slow(seconds: float = 30.0) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return f"slept {seconds} s"

    @server.tool()
    def getenv(name: str) -> str:
        """One variable of this server's environment."""
        return os.environ.get(name, "(unset)")

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool ``grown`` and tell the client that the tool list changed."""

        def grown() -> str:
            """A tool added at run time."""
            return "grown here"

        server.add_tool(grown)
        await ctx.session.send_tool_list_changed()
        return "added the tool grown"

    @server.tool()
    def crash() -> str:
        """Exit the server process in the middle of the call."""
        os._exit(5)

    if mode == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
