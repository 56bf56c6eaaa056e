"""A run's events as Server-Sent Events, read from its event log (run/event_log.py).

Every connection tails the run directory's `events.jsonl` from its own position: from the
start, or after `Last-Event-ID` (the log's ids span the run's whole life, resumes included).
Nothing is queued per client, so a slow client costs no memory: when its socket buffer is
full, uvicorn's flow control holds this generator until the client reads (backpressure),
and the run itself never waits for any client. A client that falls behind catches up from
the file; one that drops reconnects with Last-Event-ID and loses nothing.

When the run is neither queued nor executing here and the client has read the whole log,
the stream ends with one `end` event (no id) saying the run's status; an interrupted run
(the server was killed) ends the same way, and reconnecting after a resume continues.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio

from ..run.event_log import LogReader
from .runs import RunManager

KEEP_ALIVE = b": keep-alive\n\n"


def frame(event: dict[str, Any]) -> bytes:
    """One SSE message: id (the log's), event (the type), data (the wire form, one JSON line)."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event['id']}\nevent: {event['type']}\ndata: {data}\n\n".encode("utf-8")


def end_frame(run_id: str, status: str) -> bytes:
    """The last message of a stream: no id, so Last-Event-ID stays on the last real event."""
    return f"event: end\ndata: {json.dumps({'run_id': run_id, 'status': status})}\n\n".encode("utf-8")


def parse_last_event_id(header: str | None, query: str | None) -> int:
    """`Last-Event-ID` (reconnects) or `?after=` (first connections); 0 when absent or not a count."""
    for value in (header, query):
        if value is not None and value.strip().isdigit():
            return int(value.strip())
    return 0


async def run_events(manager: RunManager, run_id: str, after: int, *, heartbeat: float) -> AsyncIterator[bytes]:
    """The SSE body of one connection (see the module docstring)."""
    reader = LogReader(manager.run_dir(run_id), after=after)
    yield b"retry: 2000\n\n"  # how long an EventSource waits before reconnecting
    while True:
        changed = manager.changed(run_id)  # before reading: a change after the read wakes us
        events = reader.read_new()  # page-cache reads: quick, and no worker thread is taken from runs
        for event in events:
            yield frame(event)
        if events:
            continue
        if not manager.live(run_id):
            events = reader.read_new()  # what came before it ended
            for event in events:
                yield frame(event)
            if not events:
                yield end_frame(run_id, manager.status(run_id))
                return
            continue
        with anyio.move_on_after(heartbeat) as waited:
            await changed.wait()
        if waited.cancelled_caught:
            yield KEEP_ALIVE
