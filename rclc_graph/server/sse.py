"""A run's events as Server-Sent Events, read from its event log (run/event_log.py).

Every connection tails the run directory's `events.jsonl` from its own position: from the
start, or after `Last-Event-ID` (the log's ids span the run's whole life, resumes included).
Nothing is queued per client, so a slow client costs no memory: when its socket buffer is
full, uvicorn's flow control holds this generator until the client reads (backpressure),
and the run itself never waits for any client. A client that falls behind catches up from
the file; one that drops reconnects with Last-Event-ID and loses nothing.

The log is read in bounded windows and sent in chunks, and the stream yields to the event
loop after each chunk: a client that reads fast, or one that dropped (a dead socket takes
writes without blocking), never holds up other requests for longer than one chunk, and the
dropped one is noticed at its next chunk and stopped.

When the run is neither queued nor executing here and the client has read the whole log,
the stream ends with one `end` event (no id) saying the run's status; an interrupted run
(the server was killed) ends the same way, and reconnecting after a resume continues.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel

from ..run.event_log import LogReader
from .runs import RunManager
from .schemas import parse_count

KEEP_ALIVE = b": keep-alive\n\n"


_EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # what an SSE `event:` field may carry here
UNKNOWN_EVENT = "unknown"  # the name given to an event whose type is not such a name (an edited log)
CHUNK_BYTES = 64 * 1024  # frames are sent in chunks of about this size, yielding to the loop between


def frame(event: dict[str, Any]) -> bytes:
    """One SSE message: id (the log's), event (the type), data (the wire form, one JSON line).

    No field can end the message or start another: the id is an int (the log's reader
    keeps only those), the data is one line of JSON (json.dumps escapes every line break),
    and an event type that is not a plain name (`\n\nevent: end` in an edited log injected
    frames) is sent as `unknown`; the data still holds it, escaped."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    kind = event.get("type")
    name = kind if isinstance(kind, str) and _EVENT_NAME.fullmatch(kind) else UNKNOWN_EVENT
    return f"id: {int(event['id'])}\nevent: {name}\ndata: {data}\n\n".encode("utf-8")


def _chunks(events: list[dict[str, Any]]) -> list[bytes]:
    """The frames of `events` joined into chunks of about CHUNK_BYTES (one send each)."""
    chunks, pending, size = [], [], 0
    for event in events:
        data = frame(event)
        pending.append(data)
        size += len(data)
        if size >= CHUNK_BYTES:
            chunks.append(b"".join(pending))
            pending, size = [], 0
    if pending:
        chunks.append(b"".join(pending))
    return chunks


def end_frame(run_id: str, status: str) -> bytes:
    """The last message of a stream: no id, so Last-Event-ID stays on the last real event."""
    return f"event: end\ndata: {json.dumps({'run_id': run_id, 'status': status})}\n\n".encode("utf-8")


def parse_last_event_id(header: str | None, query: str | None) -> int:
    """`Last-Event-ID` (reconnects) or `?after=` (first connections); 0 when absent or not a count."""
    for value in (header, query):
        count = parse_count(value)
        if count is not None:
            return count
    return 0


async def run_events(manager: RunManager, run_id: str, after: int, *, heartbeat: float) -> AsyncIterator[bytes]:
    """The SSE body of one connection (see the module docstring)."""
    reader = LogReader(manager.run_dir(run_id), after=after)
    yield b"retry: 2000\n\n"  # how long an EventSource waits before reconnecting
    while True:
        changed = manager.changed(run_id)  # before reading: a change after the read wakes us
        events = reader.read_new(limit_bytes=CHUNK_BYTES)  # page-cache reads: quick, no worker thread
        for chunk in _chunks(events):
            yield chunk
            # Sending to a dead socket never blocks, so without this a client that dropped
            # kept the loop busy writing the whole log into the void: the server answered
            # nothing else, and Starlette's disconnect listener never ran to stop this stream.
            await anyio.lowlevel.checkpoint()
        if events:
            continue
        if not manager.live(run_id):
            events = reader.read_new(limit_bytes=CHUNK_BYTES)  # what came before it ended
            for chunk in _chunks(events):
                yield chunk
                await anyio.lowlevel.checkpoint()
            if not events:
                yield end_frame(run_id, manager.status(run_id))
                return
            continue
        with anyio.move_on_after(heartbeat) as waited:
            await changed.wait()
        if waited.cancelled_caught:
            yield KEEP_ALIVE
