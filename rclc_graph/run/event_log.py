"""A run's persisted event log: `events.jsonl` in its run directory, one typed event per line.

Each line is an event's wire form (`RunEvent.to_dict()`) with an `id` in front: 1, 2, 3, ...
over the whole life of the run, resumed attempts included (a resume appends to the same
log). The server writes it and serves it as Server-Sent Events, whose `Last-Event-ID` is
this id, so a client that reconnects, or a server that restarted, continues where it was.

Why a killed writer never breaks reading: every line is written with one `write` on a file
opened with O_APPEND, so a process killed mid-run leaves whole lines and at most one torn
last line without its newline. Readers take only lines that end with a newline; a writer
that opens the log cuts such a torn tail off before it appends. The log is fsynced every
`fsync_every` events, every `fsync_seconds`, at each run's last event and on close, so a
machine crash loses at most that window (a killed process loses nothing: the kernel has it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import anyio

from ..results.run_events import RunEvent
from ..spec import bounded_json
from ..errors import UsageError

logger = logging.getLogger(__name__)

EVENT_LOG = "events.jsonl"


def log_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where a run directory's event log is."""
    return Path(run_dir) / EVENT_LOG


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The events in `data` (bytes of the log from some line start) and how many bytes the
    whole lines among them took; a torn last line is left for later. A line that is not JSON,
    or is nested deeper than JSON files may be (`spec/bounded_json.py`: an edited log; one
    such line used to kill the run's event stream on every reconnect), is skipped with a
    warning in the server's log."""
    events: list[dict[str, Any]] = []
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            item = bounded_json.loads(line)
        except ValueError as error:  # not UTF-8, not JSON, or nested too deeply (JSONLimitError)
            logger.warning("event log: skipped a line that is not an event (%s)", error)
            continue
        if isinstance(item, dict) and isinstance(item.get("id"), int):
            events.append(item)
    return events, end


def read_events(run_dir: str | os.PathLike[str], *, after: int = 0) -> list[dict[str, Any]]:
    """Every whole event of a run directory's log with id > `after` ([] without a log)."""
    path = log_path(run_dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    events, _ = parse_lines(data)
    return [event for event in events if event["id"] > after]


class LogReader:
    """Reads a log incrementally from a byte offset (the server's SSE streams tail it)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, after: int = 0) -> None:
        self.path = log_path(run_dir)
        self.after = after
        self.offset = 0

    def read_new(self, *, limit_bytes: int = 1 << 20) -> list[dict[str, Any]]:
        """Whole events written since the last call (at most about `limit_bytes` of them),
        skipping those with id <= `after`."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(limit_bytes)
        except FileNotFoundError:
            return []
        events, used = parse_lines(data)
        if used == 0 and len(data) >= limit_bytes:  # one line longer than the window: read it whole
            events, used = self._long_line()
        self.offset += used
        fresh = [event for event in events if event["id"] > self.after]
        if fresh:
            self.after = fresh[-1]["id"]
        return fresh

    def _long_line(self) -> tuple[list[dict[str, Any]], int]:
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            line = handle.readline()
        return parse_lines(line)


class EventLogWriter:
    """Appends a run's typed events to its log (see the module docstring); one writer per run
    directory at a time (the run holds the directory's lock while it runs)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, fsync_every: int = 64, fsync_seconds: float = 1.0) -> None:
        self.path = log_path(run_dir)
        self.fsync_every, self.fsync_seconds = fsync_every, fsync_seconds
        self._fd: int | None = None
        self.last_id = 0
        self._unsynced = 0
        self._synced_at = time.monotonic()

    def open(self) -> EventLogWriter:
        """Open (creating) the log, cut a torn tail a killed writer left, and continue its ids."""
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        data = b""
        size = os.fstat(fd).st_size
        if size:
            data = os.pread(fd, size, 0)
        events, whole = parse_lines(data)
        if whole < len(data):
            os.ftruncate(fd, whole)
            logger.warning("event log %s: cut a torn last line (%d bytes) a killed writer left", self.path,
                           len(data) - whole)
        self.last_id = max((event["id"] for event in events), default=0)
        self._fd = fd
        return self

    async def append(self, event: RunEvent) -> int:
        """Write one event as one line; returns its id."""
        if self._fd is None:
            raise UsageError("event log: open() it before appending")
        self.last_id += 1
        line = json.dumps({"id": self.last_id, **event.to_dict()}, ensure_ascii=False, separators=(",", ":"))
        data = (line + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        if written != len(data):  # regular files take whole writes; say so if one ever did not
            raise OSError(f"event log {self.path}: wrote {written} of {len(data)} bytes")
        self._unsynced += 1
        if event.terminal or self._unsynced >= self.fsync_every or time.monotonic() - self._synced_at >= self.fsync_seconds:
            await self.sync()
        return self.last_id

    async def sync(self) -> None:
        """fsync what was appended (in a worker thread: the event loop never waits on the disk)."""
        if self._fd is not None and self._unsynced:
            await anyio.to_thread.run_sync(os.fsync, self._fd)
            self._unsynced = 0
            self._synced_at = time.monotonic()

    def close(self) -> None:
        """fsync and close."""
        if self._fd is not None:
            if self._unsynced:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
