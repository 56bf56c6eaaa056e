"""A real `rclc-graph serve` app on a loopback port inside the test process (uvicorn in a
thread), over tiny random models registered as `embedded`, plus an SSE reader."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import uvicorn

from rclc_graph import ModelPool
from rclc_graph.server import ServerSettings, create_app
from rclc_graph.spec.models import ModelSpec

PAIR_YAML = """\
version: 1
name: pair
description: a reader hands a writer its state; the writer answers
inputs:
  question: {type: str, description: what to answer}
  document: {type: str, description: what to read}
models:
  - {name: base, source: embedded}
agents:
  - {name: reader, model: base, max_new_tokens: 4}
  - {name: writer, model: base, max_new_tokens: 6}
nodes:
  - {name: read, agent: reader, generate: false, prompt: "Question: {question} Document: {document}"}
  - {name: answer, agent: writer, output: true, prompt: "Question: {question} Answer:"}
edges:
  - {source: read, target: answer, policy: {mode: state, ratio: 2}}
"""

PAIR_INPUTS = {"question": "Who owns Cedar?", "document": "The Cedar project is owned by Alice Moreno. " * 3}


def listening_socket() -> socket.socket:
    """A socket already bound to a free loopback port, for `uvicorn.Server.run(sockets=[...])`:
    the port is held from the moment it is chosen (picking a free port, closing it and letting
    the server bind it again leaves a window in which a parallel test can take it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # a client may connect before the server has started: it waits, it is not refused
    return sock


def tiny_pool(tiny: tuple[Any, Any]) -> ModelPool:
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny)
    return pool


def write_topologies(directory: Path) -> Path:
    folder = directory / "topologies"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pair.yaml").write_text(PAIR_YAML, encoding="utf-8")
    examples = directory / "examples" / "inputs"
    examples.mkdir(parents=True, exist_ok=True)
    (examples / "pair.json").write_text(json.dumps(PAIR_INPUTS), encoding="utf-8")
    return folder


@contextmanager
def live_server(directory: Path, pool: ModelPool, **options: Any) -> Iterator[tuple[str, Any]]:
    """(base URL, app) of a server on a free loopback port; stopped (gracefully) on exit."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    settings = ServerSettings(runs_dir=directory / "runs", topologies_dir=directory / "topologies",
                              examples_dir=directory / "examples" / "inputs", port=port, **options)
    app = create_app(settings, pool=pool)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def read_sse(response: httpx.Response | Iterator[str]) -> list[dict[str, Any]]:
    """Every message of an SSE response (or of the rest of its lines) until it ends:
    {"id", "event", "data"} with data parsed."""
    messages, fields = [], {}
    lines = response.iter_lines() if isinstance(response, httpx.Response) else response
    for line in lines:
        if line == "":
            if "data" in fields:
                messages.append({"id": fields.get("id"), "event": fields.get("event"), "data": json.loads(fields["data"])})
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value
    return messages


def wait_status(client: httpx.Client, run_id: str, statuses: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"/runs/{run_id}").json()
        if body["status"] in statuses:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} stayed {body['status']}")
        time.sleep(0.05)
