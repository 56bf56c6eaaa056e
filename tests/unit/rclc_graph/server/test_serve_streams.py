"""Event streams against clients that drop, and logs someone edited (issue 24 items 2 and 6),
on a real uvicorn server on loopback. Nothing here is timed: a dropped client is judged by
what the server did after it left (how many writes went into the dead socket), not by how
long anything took."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading

import anyio
import httpx
import pytest

from rclc_graph.run.event_log import log_path
from rclc_graph.server.sse import frame, run_events

from tests.helpers.servers import PAIR_INPUTS, live_server, read_sse, tiny_pool, write_topologies

SEND_FAILED = "socket.send() raised exception"
WAIT = 60.0  # bound for conditions that hold at once on any machine (never reached unless broken)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_qwen3):
    directory = tmp_path_factory.mktemp("streams")
    write_topologies(directory)
    with live_server(directory, tiny_pool(tiny_qwen3)) as (url, app):
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client, app, directory


def _finished_run(client) -> str:
    accepted = client.post("/runs", json={"topology": "pair", "inputs": PAIR_INPUTS})
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    with client.stream("GET", f"/runs/{run_id}/events") as response:
        read_sse(response)
    return run_id


def _append(path, lines: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# issue 24 item 2: a client that connected to a large log's stream and dropped kept the server
# writing the whole log into the dead socket without yielding (632,481 send errors logged, every
# other request stalled)
def test_a_client_that_drops_stops_its_stream_and_stalls_nothing(server):
    client, app, directory = server
    run_id = _finished_run(client)
    path = log_path(directory / "runs" / run_id)
    last = max(json.loads(line)["id"] for line in path.read_text().splitlines())
    token = {"type": "token", "node": "answer", "index": 0, "text": "x" * 200}
    _append(path, [{"id": last + i, **token} for i in range(1, 40_001)])  # about 10 MB of events
    collected = _Collect()
    logging.getLogger("asyncio").addHandler(collected)
    try:
        host, port = client.base_url.host, client.base_url.port
        with socket.create_connection((host, port)) as raw:
            raw.sendall(f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            assert raw.recv(4096)  # the stream started
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        done = threading.Event()
        for _ in range(int(WAIT / 0.05)):  # the server notices the reset and ends the stream
            if app.state.manager.streams == 0:
                done.set()
                break
            done.wait(0.05)
        assert done.is_set(), "the dropped client's stream never ended"
        assert client.get("/server").status_code == 200
    finally:
        logging.getLogger("asyncio").removeHandler(collected)
    failed_sends = [message for message in collected.messages if SEND_FAILED in message]
    assert len(failed_sends) < 20, f"{len(failed_sends)} writes into the dead socket"


# issue 24 item 6: an event `type` holding "\n\nevent: end" injected SSE frames; a deep line in
# events.jsonl killed the run's stream on every reconnect
def test_an_edited_log_cannot_inject_frames_or_kill_the_stream(server):
    client, _, directory = server
    run_id = _finished_run(client)
    path = log_path(directory / "runs" / run_id)
    last = max(json.loads(line)["id"] for line in path.read_text().splitlines())
    deep = "[" * 100_000 + "]" * 100_000
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": last + 1, "type": "x\n\nevent: end\ndata: {}", "node": "n"}) + "\n")
        handle.write('{"id": %d, "type": "token", "deep": %s}\n' % (last + 2, deep))
        handle.write(json.dumps({"id": last + 3, "type": "token", "node": "answer", "index": 9, "text": "after"}) + "\n")
    for _ in range(2):  # and again, as a reconnecting client would
        with client.stream("GET", f"/runs/{run_id}/events", params={"after": last}) as response:
            messages = read_sse(response)
        assert [message["event"] for message in messages] == ["unknown", "token", "end"]
        assert messages[0]["data"]["type"] == "x\n\nevent: end\ndata: {}"  # carried as data, escaped
        assert messages[1]["data"]["text"] == "after"


def _tokens(first: int, count: int) -> list[dict]:
    return [{"id": first + i, "type": "token", "node": "answer", "index": i, "text": "x" * 2000} for i in range(count)]


# issue 24 item 2: a reconnect whose Last-Event-ID lies past the first two 64 KiB windows of a
# log got only `end` (the windows it skipped read as "nothing new"), and lost every later event
def test_a_reconnect_past_the_first_windows_of_a_large_log_gets_every_later_event(server):
    client, _, directory = server
    run_id = _finished_run(client)
    path = log_path(directory / "runs" / run_id)
    last = max(json.loads(line)["id"] for line in path.read_text().splitlines())
    _append(path, _tokens(last + 1, 300))  # 0.6 MB: about ten windows
    with client.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": str(last + 250)}) as response:
        messages = read_sse(response)
    assert [int(message["id"]) for message in messages[:-1]] == list(range(last + 251, last + 301))
    assert messages[-1]["event"] == "end" and messages[-1]["data"]["status"] == "finished"


class _Run:
    """What run_events asks of the run manager: a run that is `live` (still executing, no new
    event coming) or has ended."""

    def __init__(self, run_dir, *, live: bool) -> None:
        self.directory, self.is_live = run_dir, live

    def run_dir(self, run_id):
        return self.directory

    def changed(self, run_id):
        return anyio.Event()  # never set: nothing more will be logged

    def live(self, run_id):
        return self.is_live

    def status(self, run_id):
        return "finished"


def _ids(chunks: list[bytes]) -> list[int]:
    return [int(line[4:]) for chunk in chunks for line in chunk.decode().splitlines() if line.startswith("id: ")]


# issue 24 item 2: the same skipped windows stalled a live run's stream until its next event
def test_a_live_runs_stream_reads_past_skipped_windows_without_waiting(tmp_path):
    _append(log_path(tmp_path), _tokens(1, 300))

    async def main():
        chunks = []
        with anyio.fail_after(WAIT):  # never reached unless the stream waits for an event that never comes
            async for chunk in run_events(_Run(tmp_path, live=True), "r", 250, heartbeat=WAIT * 2):
                chunks.append(chunk)
                if _ids(chunks)[-1:] == [300]:
                    break
        return chunks

    assert _ids(anyio.run(main)) == list(range(251, 301))


# issue 24 item 2: the stream itself asks whether its client is there (Starlette stops a
# stream on a disconnect only for ASGI servers before spec 2.4)
def test_a_stream_whose_client_has_gone_stops_after_the_chunk_it_was_sending(tmp_path):
    _append(log_path(tmp_path), _tokens(1, 300))
    asked = []

    async def gone():
        asked.append(True)
        return True

    async def main():
        return [chunk async for chunk in run_events(_Run(tmp_path, live=False), "r", 0, heartbeat=WAIT, disconnected=gone)]

    chunks = anyio.run(main)
    assert chunks[0].startswith(b"retry:") and len(chunks) == 2 and asked == [True]
    assert _ids(chunks) and b"event: end" not in chunks[1]  # no end: nobody is there to read it


# issue 24 item 6: a logged event of type `end` went out as `event: end`, which clients take
# for the stream's own end (the UI stopped following the run)
def test_a_logged_event_cannot_pass_for_the_streams_end():
    assert b"event: unknown\n" in frame({"id": 3, "type": "end"})
    assert b"event: hop.delivered\n" in frame({"id": 4, "type": "hop.delivered"})
