"""The shop's order look-ups as a Model Context Protocol server (the official `mcp` SDK).

The same read-only SQLite queries as examples/shop_tools.py (examples/shop.sqlite), served
to any MCP client instead of imported: topologies/mcp_agent.yaml names this server in its
`mcp_servers:` section and gives its agent `tools: [mcp:shop]`; rclc-graph starts it for
the run and stops it when the run ends.

    python examples/mcp_shop_server.py                        # stdio (what the topology runs)
    python examples/mcp_shop_server.py --http 8765            # streamable HTTP on 127.0.0.1:8765/mcp
    python examples/mcp_shop_server.py --http 0               # any free port; prints the URL first

The tool schemas the model is shown come from the type hints and docstrings below, through
the SDK (MCPServer), exactly as an MCP client such as rclc-graph lists them.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # shop_tools sits beside this file

import shop_tools  # noqa: E402  (after the path line above)
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

server = MCPServer("shop", instructions="Read-only look-ups of the orders of an online shop.", log_level="WARNING")


@server.tool()
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up one order of the shop: who placed it, its status, carrier, expected delivery, items and total.

    Args:
        order_id: The order number the customer quotes, for example A-1002.
    """
    try:
        return shop_tools.lookup_order(order_id)
    except LookupError as error:  # the model reads what was wrong (the SDK hides other exceptions' text)
        raise ToolError(f"LookupError: {error}") from None


@server.tool()
def orders_of_customer(name: str) -> list[dict[str, str]]:
    """List the orders of one customer of the shop, newest first, with each order's status.

    Args:
        name: The customer's name or part of it (at least 3 characters), for example Jonas.
    """
    try:
        return shop_tools.orders_of_customer(name)
    except LookupError as error:
        raise ToolError(f"LookupError: {error}") from None


def serve_http(port: int) -> None:
    """Streamable HTTP on 127.0.0.1 (loopback only). With port 0 the system picks a free port;
    the first line printed is the server's URL, so a caller can read it."""
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    arguments = parser.parse_args()
    if arguments.http is None:
        server.run()  # stdio
    else:
        serve_http(arguments.http)


if __name__ == "__main__":
    main()
