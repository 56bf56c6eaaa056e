"""A small OpenAI-compatible server on loopback, for testing `backend: openai` models.

`ChatStub` answers POST /v1/chat/completions (streamed or not) with a fixed reply, or
misbehaves on request: `status` (e.g. 500 or 404 with an OpenAI-style error body), `delay`
(seconds before answering: a slow server), `hold` (requests wait until `release()` or
`close()`, then get 503 and are never forwarded: a server slower than any timeout, whose
abandoned requests do not reach the real server behind it later), and it records every
request (path, headers, JSON body). `forward_to` turns it into a proxy for a real server
(vLLM's) that can be made to fail and then recover. It listens on 127.0.0.1 only, serves in
a daemon thread and stops in `close()` (a context manager); nothing here loops without a
bound.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


HOLD_LIMIT_SECONDS = 600.0  # a held request is answered by then even if nobody releases it


class ChatStub:
    """A loopback chat-completions server (see the module docstring)."""

    def __init__(self, reply: str = "Hello from the stub.", *, forward_to: str | None = None, port: int = 0) -> None:
        self.reply = reply
        self.status = 200
        self.delay = 0.0
        self.hold = False
        self._released = threading.Event()
        self.forward_to = forward_to  # "http://127.0.0.1:PORT": pass requests on when status is 200
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub._lock:
                    stub.requests.append({"path": self.path, "body": body,
                                          "headers": {key.lower(): value for key, value in self.headers.items()}})
                    status, delay, forward, hold = stub.status, stub.delay, stub.forward_to, stub.hold
                    released = stub._released  # this hold's: a later hold waits for its own release
                if hold:
                    released.wait(HOLD_LIMIT_SECONDS)
                    try:
                        self._send_json(503, {"error": {"message": "stub held the request", "type": "stub",
                                                        "code": 503}})
                    except OSError:  # its client gave up long ago
                        pass
                    return
                if delay:
                    time.sleep(delay)
                if status != 200:
                    self._send_json(status, {"error": {"message": f"stub error {status}", "type": "stub",
                                                       "code": status}})
                elif forward is not None:
                    self._forward(forward, body)
                elif not self.path.endswith("/chat/completions"):
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                elif body.get("stream"):
                    self._stream(body)
                else:
                    self._send_json(200, stub.completion(body))

            def _send_json(self, status: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                words = stub.reply.split(" ")
                pieces = [word if index == 0 else " " + word for index, word in enumerate(words)]
                for piece in pieces:
                    chunk = {"id": "stub", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                             "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                usage = {"id": "stub", "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                         "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": len(pieces),
                                                  "total_tokens": 1 + len(pieces)}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

            def _forward(self, target: str, body: dict[str, Any]) -> None:
                parts = urlsplit(target)
                connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
                try:
                    connection.request("POST", self.path, json.dumps(body), {"Content-Type": "application/json"})
                    answer = connection.getresponse()
                    data = answer.read()
                finally:
                    connection.close()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port 0: any free one
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="chat-stub", daemon=True)
        self.thread.start()

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": "stub", "object": "chat.completion", "created": 0, "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def release(self) -> None:
        """Answer the held requests (503) and hold no more (until `hold` is set again)."""
        with self._lock:
            self.hold = False
            released, self._released = self._released, threading.Event()
        released.set()

    def close(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> ChatStub:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def free_port() -> int:
    """A loopback port nothing listens on right now (for 'connection refused')."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
