"""A small real MCP server (the official SDK's MCPServer) for the MCP tool tests: arithmetic,
an environment look-up, a tool that kills the server and one that sleeps.

    python tests/helpers/mcp_test_server.py                  # stdio
    python tests/helpers/mcp_test_server.py --http 0         # streamable HTTP on 127.0.0.1, a free port; prints the URL
    python tests/helpers/mcp_test_server.py --exit-at-start  # writes a reason to stderr and exits 3 (a server that never starts)
    python tests/helpers/mcp_test_server.py --silent         # starts, never speaks MCP (a server that hangs at start)

Each process writes its PID to the file in $MCP_TEST_PID_FILE when that is set (one line per
start), before it imports the SDK, so a test can check the process is gone after the run.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def _record_pid() -> None:
    path = os.environ.get("MCP_TEST_PID_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")


if __name__ == "__main__":  # the failure modes come first: they need no SDK
    _record_pid()
    if "--exit-at-start" in sys.argv:
        sys.stderr.write("arithmetic server: cannot open its database (a test of a server that never starts)\n")
        sys.exit(3)
    if "--silent" in sys.argv:
        time.sleep(3600)

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

server = MCPServer("arithmetic", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor (not zero).
    """
    if b == 0:
        raise ToolError("cannot divide by zero")
    return a / b


@server.tool()
def read_env(name: str) -> str:
    """The value of an environment variable of the server process ('' when unset).

    Args:
        name: The variable's name.
    """
    return os.environ.get(name, "")


@server.tool()
def crash() -> str:
    """End the server process at once (for tests of a server that dies)."""
    sys.stderr.write("arithmetic server: crash() called, exiting with status 7\n")
    sys.stderr.flush()
    os._exit(7)


@server.tool()
def pause(seconds: float) -> str:
    """Sleep, then answer (for tests of a slow tool).

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return f"slept {seconds:g} s"


def _serve_http(port: int) -> None:
    import anyio
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    # Listening before the URL is printed: a client that connects as soon as it reads the line
    # waits in the backlog until uvicorn accepts, instead of being refused (bound is not enough).
    listener.listen(128)
    print(f"http://127.0.0.1:{listener.getsockname()[1]}/mcp", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    anyio.run(uvicorn.Server(config).serve, [listener])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT")
    arguments = parser.parse_args()
    if arguments.http is None:
        server.run()
    else:
        _serve_http(arguments.http)


if __name__ == "__main__":
    main()
