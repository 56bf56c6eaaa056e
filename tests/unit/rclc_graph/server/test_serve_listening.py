"""`rclc-graph serve --port 0` prints its address only once the socket listens (issue 24).

A script that reads "serving on ..." and connects at once must wait in the backlog, not be
refused: uvicorn binds the socket early and listens only once its own startup has run, so
CI's MCP test (whose helper server did the same) failed by chance when it connected first.
This checks the socket's state at the moment the line is printed, so it fails every time
the listen is missing, whatever the machine's speed."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from rclc_graph.views.cli import app

pytest.importorskip("uvicorn")


def test_the_printed_address_already_accepts_connections(tmp_path, monkeypatch):
    import uvicorn

    seen: dict[str, int] = {}

    def run(self, sockets=None):  # instead of serving: check the handed socket and connect to it
        [listening] = sockets
        try:
            seen["accepting"] = listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            with socket.create_connection(listening.getsockname(), timeout=5):
                seen["connected"] = 1
        finally:
            listening.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    (tmp_path / "topologies").mkdir()
    result = CliRunner().invoke(app, ["serve", "--topologies", str(tmp_path / "topologies"),
                                      "--runs", str(tmp_path / "runs"), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "serving on http://127.0.0.1:" in result.output
    assert seen == {"accepting": 1, "connected": 1}
