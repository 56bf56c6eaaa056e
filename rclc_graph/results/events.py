"""A bounded, ordered event stream with epochs, so a slow consumer slows producers down.

Producers `await stream.publish(kind, payload, run_id=..., epoch=...)`; one consumer iterates
`async for event in stream`. The queue is bounded by BOTH event count and estimated bytes:
a publish that would exceed either bound waits (backpressure) until the consumer makes room.
One event larger than the byte bound by itself waits until the queue is empty and then
passes alone: refusing it failed the run it belonged to (a 1.9 MB answer failed its run, and
every resume of it the same way, so the run could never finish). Memory stays bounded by
`max_bytes` or one event, whichever is larger; the graph bounds what one event can hold
(a node's text: `MAX_NODE_TEXT_BYTES`).
Blocked publishers are served strictly first-come first-served, and an event receives its
sequence number when it enters the queue, so `seq` is strictly increasing in delivery order
however many producers publish at once.

Epochs make cancellation clean: a run (or one attempt of it) publishes under an epoch from
`open_epoch()`. `retire(epoch)` drops that epoch's queued events and blocked publishes, and
every later publish under it; all are counted in `dropped_stale`, none is delivered late.
`cancel(epoch, ...)` retires the epoch and then queues one `cancelled` notice for it, the only
event of a retired epoch that is ever delivered.

The stream lives on one event loop (anyio, asyncio or trio). Worker threads publish through
`anyio.from_thread.run(stream.publish, ...)`.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, Mapping

import anyio

from ..errors import UsageError

EventKind = Literal["run", "node", "hop", "token", "error", "cancelled", "edge", "tool"]
KINDS: tuple[str, ...] = ("run", "node", "hop", "token", "error", "cancelled", "edge", "tool")
# What each kind's payload holds, and the typed event it becomes: run_events.py (docs/streaming.md).
EVENT_OVERHEAD_BYTES = 64  # fixed cost per event: the dataclass, its seq/epoch ints and the queue slot


def estimate_bytes(value: Any, _depth: int = 0) -> int:
    """A cheap, deterministic size estimate of a JSON-like payload (not `sys.getsizeof`'s
    object accounting: what matters is that a big payload counts as big)."""
    if value is None or isinstance(value, (bool, int, float)):
        return 8
    if isinstance(value, str):
        return len(value) + 8
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value) + 8
    if _depth > 32:
        return 8
    if isinstance(value, Mapping):
        return 16 + sum(estimate_bytes(key, _depth + 1) + estimate_bytes(item, _depth + 1) for key, item in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return 16 + sum(estimate_bytes(item, _depth + 1) for item in value)
    return sys.getsizeof(value)


@dataclass(frozen=True)
class Event:
    """One event of a run as the consumer receives it (kinds: `KINDS`)."""

    seq: int  # strictly increasing in delivery order
    epoch: int
    run_id: str
    kind: EventKind
    payload: Mapping[str, Any]
    nbytes: int  # the estimate the byte bound counts

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: every field, in order, the payload as a dict."""
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        data["payload"] = dict(self.payload)
        return data


@dataclass(frozen=True)
class StreamStats:
    """Counters of an EventStream (`EventStream.stats()`): bounds, traffic, drops, high water."""

    max_events: int
    max_bytes: int
    published: int  # events that entered the queue
    delivered: int
    dropped_stale: int  # events of retired epochs: dropped at publish, while blocked, or from the queue
    queued: int
    queued_bytes: int
    high_water_events: int  # the most events ever queued at once
    high_water_bytes: int  # the most bytes ever queued at once (over max_bytes only for one oversized event)
    blocked_publishes: int  # publishes that had to wait for room
    retired_epochs: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(eq=False)
class _Waiter:
    epoch: int
    run_id: str
    kind: str
    payload: Mapping[str, Any]
    nbytes: int
    exempt: bool
    wake: anyio.Event = field(default_factory=anyio.Event)
    outcome: Event | None = None
    finished: bool = False
    closed: bool = False


class EventStream:
    """A bounded, ordered stream of run events with epochs (see the module docstring): a slow
    consumer slows its producers, a cancelled run's stale events are dropped, never late."""

    def __init__(self, *, max_events: int = 1024, max_bytes: int = 1 << 20) -> None:
        if type(max_events) is not int or max_events < 1:
            raise UsageError(f"max_events: expected an int >= 1, got {max_events!r}")
        if type(max_bytes) is not int or max_bytes < EVENT_OVERHEAD_BYTES:
            raise UsageError(f"max_bytes: expected an int >= {EVENT_OVERHEAD_BYTES}, got {max_bytes!r}")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._queue: deque[tuple[Event, bool]] = deque()  # (event, exempt from retirement)
        self._queued_bytes = 0
        self._waiters: deque[_Waiter] = deque()
        self._nonempty = anyio.Event()
        self._retired: set[int] = set()
        self._next_seq = 1
        self._next_epoch = 1
        self._closed = False
        self._published = 0
        self._delivered = 0
        self._dropped_stale = 0
        self._high_events = 0
        self._high_bytes = 0
        self._blocked = 0

    # -- producers -------------------------------------------------------------------------

    def open_epoch(self) -> int:
        """A fresh epoch number (1, 2, ...); one per run or per retry of a run."""
        epoch = self._next_epoch
        self._next_epoch += 1
        return epoch

    async def publish(
        self, kind: EventKind, payload: Mapping[str, Any] | None = None, *, run_id: str, epoch: int
    ) -> Event | None:
        """Queue one event, waiting while the stream is full. Returns the event, or None when
        its epoch is (or becomes, while waiting) retired. ClosedResourceError after close()."""
        return await self._publish(kind, payload, run_id, epoch, exempt=False)

    def try_publish(
        self, kind: EventKind, payload: Mapping[str, Any] | None = None, *, run_id: str, epoch: int
    ) -> Event | None:
        """Like publish but never waits: raises anyio.WouldBlock when there is no room now."""
        waiter = self._prepare(kind, payload, run_id, epoch, exempt=False)
        if waiter is None:
            return None
        if self._waiters or not self._fits(waiter.nbytes):
            raise anyio.WouldBlock
        return self._enqueue(waiter)

    async def cancel(self, epoch: int, *, run_id: str, payload: Mapping[str, Any] | None = None) -> Event:
        """Retire `epoch`, then queue its one `cancelled` notice (waits for room like publish)."""
        self.retire(epoch)
        event = await self._publish("cancelled", payload, run_id, epoch, exempt=True)
        assert event is not None  # exempt events are never dropped as stale
        return event

    def retire(self, epoch: int) -> int:
        """Drop `epoch`'s queued events and blocked publishes now, and its later publishes
        on arrival. Returns how many were dropped now. Idempotent."""
        self._retired.add(epoch)
        kept: deque[tuple[Event, bool]] = deque()
        dropped = 0
        for event, exempt in self._queue:
            if event.epoch == epoch and not exempt:
                self._queued_bytes -= event.nbytes
                dropped += 1
            else:
                kept.append((event, exempt))
        self._queue = kept
        for waiter in [waiter for waiter in self._waiters if waiter.epoch == epoch and not waiter.exempt]:
            self._waiters.remove(waiter)
            waiter.finished = True
            waiter.wake.set()
            dropped += 1
        self._dropped_stale += dropped
        self._pump()
        return dropped

    def close(self) -> None:
        """No more publishing: blocked and later publishes raise ClosedResourceError; the
        consumer drains what is queued, then iteration ends."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.closed = True
            waiter.wake.set()
        self._nonempty.set()

    # -- consumer --------------------------------------------------------------------------

    async def receive(self) -> Event:
        """The next event in sequence order; anyio.EndOfStream once closed and drained."""
        while not self._queue:
            if self._closed:
                raise anyio.EndOfStream
            if self._nonempty.is_set():
                self._nonempty = anyio.Event()
            await self._nonempty.wait()
        event, _exempt = self._queue.popleft()
        self._queued_bytes -= event.nbytes
        self._delivered += 1
        self._pump()
        return event

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> StreamStats:
        """A snapshot of the stream's counters."""
        return StreamStats(
            max_events=self.max_events,
            max_bytes=self.max_bytes,
            published=self._published,
            delivered=self._delivered,
            dropped_stale=self._dropped_stale,
            queued=len(self._queue),
            queued_bytes=self._queued_bytes,
            high_water_events=self._high_events,
            high_water_bytes=self._high_bytes,
            blocked_publishes=self._blocked,
            retired_epochs=tuple(sorted(self._retired)),
        )

    # -- internals -------------------------------------------------------------------------

    def _prepare(self, kind: str, payload: Mapping[str, Any] | None, run_id: str, epoch: int, *, exempt: bool) -> _Waiter | None:
        if kind not in KINDS:
            raise UsageError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
        if type(epoch) is not int:
            raise UsageError(f"epoch: expected an int from open_epoch(), got {epoch!r}")
        if not isinstance(run_id, str):
            raise UsageError(f"run_id: expected a str, got {type(run_id).__name__}")
        if self._closed:
            raise anyio.ClosedResourceError
        frozen = MappingProxyType(dict(payload or {}))
        nbytes = EVENT_OVERHEAD_BYTES + len(run_id) + estimate_bytes(frozen)
        if not exempt and epoch in self._retired:
            self._dropped_stale += 1
            return None
        return _Waiter(epoch, run_id, kind, frozen, nbytes, exempt)

    async def _publish(
        self, kind: str, payload: Mapping[str, Any] | None, run_id: str, epoch: int, *, exempt: bool
    ) -> Event | None:
        waiter = self._prepare(kind, payload, run_id, epoch, exempt=exempt)
        if waiter is None:
            return None
        if not self._waiters and self._fits(waiter.nbytes):
            return self._enqueue(waiter)
        self._blocked += 1
        self._waiters.append(waiter)
        try:
            await waiter.wake.wait()
        except BaseException:
            if not waiter.finished and waiter in self._waiters:
                self._waiters.remove(waiter)
                self._pump()  # a large waiter leaving may unblock the ones behind it
            raise
        if waiter.closed:
            raise anyio.ClosedResourceError
        return waiter.outcome

    def _fits(self, nbytes: int) -> bool:
        if len(self._queue) >= self.max_events:
            return False
        return self._queued_bytes + nbytes <= self.max_bytes or not self._queue  # an oversized event: alone

    def _enqueue(self, waiter: _Waiter) -> Event:
        event = Event(self._next_seq, waiter.epoch, waiter.run_id, waiter.kind, waiter.payload, waiter.nbytes)  # type: ignore[arg-type]
        self._next_seq += 1
        self._queue.append((event, waiter.exempt))
        self._queued_bytes += event.nbytes
        self._published += 1
        self._high_events = max(self._high_events, len(self._queue))
        self._high_bytes = max(self._high_bytes, self._queued_bytes)
        self._nonempty.set()
        return event

    def _pump(self) -> None:
        """Admit blocked publishers in arrival order while the head fits."""
        while self._waiters and self._fits(self._waiters[0].nbytes):
            waiter = self._waiters.popleft()
            waiter.outcome = self._enqueue(waiter)
            waiter.finished = True
            waiter.wake.set()
