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
dropped one is noticed at its next chunk and stopped. The stream asks itself whether its
client is still there (`disconnected`, Starlette's `request.is_disconnected`) rather than
relying on Starlette's own disconnect listener, which runs only for ASGI servers before
spec 2.4. A window that holds no event to send (ids at or before Last-Event-ID, lines
skipped) is progress too: the stream reads on, and ends only where the log ends.

When the run is neither queued nor executing here and the client has read the whole log,
the stream ends with one `end` event (no id) saying the run's status; an interrupted run
(the server was killed) ends the same way, and reconnecting after a resume continues.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel

from ..run.event_log import LogReader
from .runs import RunManager
from .schemas import parse_count

KEEP_ALIVE = b": keep-alive\n\n"


_EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # what an SSE `event:` field may carry here
UNKNOWN_EVENT = "unknown"  # the name given to an event whose type is not such a name (an edited log)
END_EVENT = "end"  # the stream's own last message: no logged event may go out under this name
CHUNK_BYTES = 64 * 1024  # frames are sent in chunks of about this size, yielding to the loop between


def frame(event: dict[str, Any]) -> bytes:
    """One SSE message: id (the log's), event (the type), data (the wire form, one JSON line).

    No field can end the message or start another: the id is an int (the log's reader
    keeps only those), the data is one line of JSON (json.dumps escapes every line break),
    and an event type that is not a plain name (`\n\nevent: end` in an edited log injected
    frames), or is `end` (it passed for the stream's own end: the UI stopped following), is
    sent as `unknown`; the data still holds it, escaped."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    kind = event.get("type")
    name = kind if isinstance(kind, str) and _EVENT_NAME.fullmatch(kind) and kind != END_EVENT else UNKNOWN_EVENT
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
    return f"event: {END_EVENT}\ndata: {json.dumps({'run_id': run_id, 'status': status})}\n\n".encode("utf-8")


def parse_last_event_id(header: str | None, query: str | None) -> int:
    """`Last-Event-ID` (reconnects) or `?after=` (first connections); 0 when absent or not a count."""
    for value in (header, query):
        count = parse_count(value)
        if count is not None:
            return count
    return 0


async def _connected_forever() -> bool:
    return False


async def run_events(manager: RunManager, run_id: str, after: int, *, heartbeat: float,
                     disconnected: Callable[[], Awaitable[bool]] = _connected_forever) -> AsyncIterator[bytes]:
    """The SSE body of one connection (see the module docstring); `disconnected` says whether
    the client has gone (the handler passes `request.is_disconnected`)."""
    reader = LogReader(manager.run_dir(run_id), after=after)
    yield b"retry: 2000\n\n"  # how long an EventSource waits before reconnecting
    while True:
        changed = manager.changed(run_id)  # before reading: a change after the read wakes us
        live = manager.live(run_id)  # before reading too: a run that has ended wrote its last events already
        offset = reader.offset
        events = reader.read_new(limit_bytes=CHUNK_BYTES)  # page-cache reads: quick, no worker thread
        for chunk in _chunks(events):
            yield chunk
            # Sending to a dead socket never blocks, so without this a client that dropped
            # kept the loop busy writing the whole log into the void: the server answered
            # nothing else, and the disconnect was never noticed to stop this stream.
            await anyio.lowlevel.checkpoint()
            if await disconnected():
                return
        if reader.offset != offset:  # more of the log, even when none of it was sent (ids <= after)
            await anyio.lowlevel.checkpoint()
            continue
        if not live:
            yield end_frame(run_id, manager.status(run_id))
            return
        with anyio.move_on_after(heartbeat) as waited:
            await changed.wait()
        if waited.cancelled_caught:
            yield KEEP_ALIVE
            if await disconnected():
                return
