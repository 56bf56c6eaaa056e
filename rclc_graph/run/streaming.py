"""Watching a run as it goes: `astream` (async) and `stream` (sync) yield its typed events.

    async with astream("topologies/fanout_qa.yaml", inputs) as events:
        async for event in events:          # RunStarted, NodeStarted, HopDelivered, TokenGenerated, ...
            ...
    print(events.result.outputs)

Both run the plan with an `EventStream` bounded by count and bytes and hand its events over
typed (results/run_events.py). The bound is the backpressure: while the consumer does not
take the next event, the run waits as soon as the stream is full (a slow consumer slows the
run down; memory stays bounded). `stream` is the sync twin: the run goes on its own event
loop in a worker thread, and its events pass through a bounded queue to the caller's thread,
so it works in plain scripts and inside a running loop (a notebook) alike.

Leaving early stops the run: leave the `async with` block (or close the sync iterator, or
`break` out of a `with stream(...)` block) and the run is cancelled as Ctrl-C cancels it
(a recorded run records what finished). Iterating without the `with` block is fine when you
iterate to the end.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Mapping

import anyio
import anyio.from_thread
import anyio.lowlevel

from ..executors import Executor, ModelPool
from ..plan.builder import Graph
from ..plan.compile import compile_plan
from ..plan.dag import Plan
from ..plan.files import plan_file
from ..results.events import EventStream, StreamStats
from ..results.run_events import RunEvent, typed
from ..results.run_result import RunResult
from ..spec.models import GraphSpec
from .record.recording import run_recorded
from .resume import read_resume_point, resume_run
from .scheduler import run_plan
from ..errors import UsageError

Runnable = Plan | Graph | GraphSpec | str | os.PathLike[str]
Start = Callable[[EventStream], Awaitable[Any]]

DEFAULT_MAX_EVENTS = 1024
DEFAULT_MAX_BYTES = 1 << 20
SYNC_QUEUE_EVENTS = 256  # events the sync twin holds between the run's thread and the caller's


class RunStream:
    """An async iterator of one run's typed events, and an async context manager that stops
    the run when the block is left early. After the last event: `result` (a RunResult), and
    for recorded runs `record` and `run_dir`."""

    def __init__(self, start: Start, *, max_events: int = DEFAULT_MAX_EVENTS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._start = start
        self.max_events, self.max_bytes = max_events, max_bytes
        self._iterator: AsyncIterator[RunEvent] | None = None
        self._events: EventStream | None = None
        self._run_scope: anyio.CancelScope | None = None  # made on the run's loop (anyio needs one)
        self._cancel_requested = False
        self.cancelled = False  # the run was stopped by cancel()
        self.result: RunResult | None = None
        self.record: dict[str, Any] | None = None
        self.run_dir: Path | None = None

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        if self._iterator is None:
            self._iterator = self._run()
        return self._iterator

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._iterator is not None:
            await self._iterator.aclose()  # type: ignore[attr-defined]

    def stats(self) -> StreamStats | None:
        """The bounded stream's counters (high water, waits for room); None before it started."""
        return None if self._events is None else self._events.stats()

    def cancel(self) -> None:
        """Stop the run and keep the stream going to its end: the events it publishes while it
        winds down, and its `run.cancelled`, still arrive. Then `cancelled` is True and
        `result` None (a recorded run's record says what finished)."""
        self._cancel_requested = True
        if self._run_scope is not None:
            self._run_scope.cancel()

    async def _run(self) -> AsyncIterator[RunEvent]:
        events = self._events = EventStream(max_events=self.max_events, max_bytes=self.max_bytes)
        outcome: dict[str, Any] = {}
        run_scope = self._run_scope = anyio.CancelScope()
        if self._cancel_requested:
            run_scope.cancel()

        async def runner() -> None:
            try:
                with run_scope:
                    outcome["value"] = await self._start(events)
            except Exception as error:  # handed to the consumer after the last event
                outcome["error"] = error
            finally:
                events.close()

        left = False
        async with anyio.create_task_group() as group:
            group.start_soon(runner)
            try:
                async for event in events:
                    yield typed(event)
            except BaseException as error:
                # The consumer left (or was cancelled): stop the run, and keep taking its events
                # until it wound down, so no publisher waits for room that never comes.
                run_scope.cancel()
                with anyio.CancelScope(shield=True):
                    async for _ in events:
                        pass
                if not isinstance(error, GeneratorExit):
                    raise
                left = True  # closing: end the generator once the task group is done, not inside it
        if left:
            return
        if "error" in outcome:
            raise outcome["error"]
        if "value" not in outcome:  # cancel() stopped it (only our own scope cancels the runner here)
            self.cancelled = True
            return
        self._finish(outcome["value"])

    def _finish(self, value: Any) -> None:
        if isinstance(value, tuple):  # (result, record, run_dir) of a recorded run or a resume
            self.result, self.record, self.run_dir = value
        else:
            self.result = value


def plan_for(
    target: Runnable,
    inputs: Mapping[str, Any] | None,
    *,
    trust_code: bool = False,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> tuple[Plan, Path | None]:
    """The plan to run and, for a file, the file (so a record names it and profiles resolve).
    `answers` answer interrupts up front (by node); `functions` are callables for function
    nodes by `call` reference (a Graph brings its own; these join them)."""
    if isinstance(target, Plan):
        given = [name for name, value in (("inputs", inputs), ("answers", answers), ("functions", functions)) if value]
        if given:
            raise UsageError(
                f"{given[0]}: a Plan is already compiled with its inputs, answers and functions; pass the Graph, "
                f"GraphSpec or topology file with these {given[0]}, or drop {given[0]}"
            )
        return target, None
    if isinstance(target, Graph):
        known = {**target.functions, **dict(functions or {})}
        return compile_plan(target.spec(), inputs or {}, trust_code=trust_code, answers=answers, functions=known), None
    if isinstance(target, GraphSpec):
        return compile_plan(target, inputs or {}, trust_code=trust_code, answers=answers, functions=functions), None
    if isinstance(target, (str, os.PathLike)):
        return plan_file(target, inputs or {}, trust_code=trust_code, answers=answers, functions=functions), Path(target)
    raise UsageError(
        f"target: expected a Plan, Graph, GraphSpec or topology file path, got {type(target).__name__}"
    )


def astream(  # 12 parameters: the run's options as run_recorded takes them, plus the stream's two bounds
    target: Runnable,
    inputs: Mapping[str, Any] | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    pool: ModelPool | None = None,
    executor: Executor | str | None = None,
    seed: int = 0,
    run_id: str | None = None,
    trust_code: bool = False,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> RunStream:
    """Run a plan, Graph, GraphSpec or topology file on `inputs` and yield its typed events.

    With `out`, the run is recorded in `out/<run_id>/` as `rclc-graph run` records it
    (`run_recorded`); without, it runs unrecorded (`run_plan`). A run that stops for a person
    ends with `run.waiting`; with `out`, `astream_resume(events.run_dir, answers=...)`
    continues it (an unrecorded run has nothing to continue from). `answers` ({node: text})
    answer interrupts up front, as `rclc-graph run --answer` does; `functions` are callables
    for function nodes by `call` reference (a Graph brings its own). Planning errors
    (GraphError) raise here, before anything runs. The stream holds at most `max_events`
    events and `max_bytes` (estimated) bytes; beyond them the run waits for the consumer.
    """
    plan, topology = plan_for(target, inputs, trust_code=trust_code, answers=answers, functions=functions)
    base_dir = None if topology is None else topology.resolve().parent

    async def start(events: EventStream) -> Any:
        if out is None:
            return await run_plan(plan, pool=pool, executor=executor, events=events, run_id=run_id, seed=seed,
                                  base_dir=base_dir)
        return await run_recorded(plan, out, seed=seed, pool=pool, executor=executor, events=events, run_id=run_id,
                                  topology_file=topology, base_dir=base_dir)

    return RunStream(start, max_events=max_events, max_bytes=max_bytes)


def astream_resume(
    run_dir: str | os.PathLike[str],
    *,
    pool: ModelPool | None = None,
    executor: Executor | None = None,
    trust_code: bool = False,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> RunStream:
    """`resume_run` with its events streamed, as `astream` streams a new run.

    `answers` ({node: text}) answer the nodes a waiting run waits for (LangGraph's
    `Command(resume=...)`); `functions` are the callables of function nodes built in Python
    (`functions=graph.functions`). The directory is checked here, before anything runs: a
    refusal (ResumeError, e.g. a waiting run without an answer) raises at the call.
    """
    read_resume_point(run_dir, trust_code=trust_code, answers=answers, functions=functions)  # refusals raise here

    async def start(events: EventStream) -> Any:
        return await resume_run(run_dir, pool=pool, executor=executor, events=events, trust_code=trust_code,
                                answers=answers, functions=functions)

    return RunStream(start, max_events=max_events, max_bytes=max_bytes)


class SyncRunStream:
    """The sync twin of RunStream: iterate it for typed events (the run goes on its own loop in
    a worker thread); close it, or leave its `with` block, to stop the run early. `result`,
    `record` and `run_dir` as for RunStream once the last event was taken."""

    _END = object()

    def __init__(self, stream: RunStream, *, queue_events: int = SYNC_QUEUE_EVENTS) -> None:
        self._stream = stream
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_events)
        self._thread: threading.Thread | None = None
        self._token: Any = None
        self._scope: anyio.CancelScope | None = None
        self._ready = threading.Event()
        self._iterator: Iterator[RunEvent] | None = None

    @property
    def result(self) -> RunResult | None:
        """The run's result once its last event was taken (None before)."""
        return self._stream.result

    @property
    def record(self) -> dict[str, Any] | None:
        """The record of a recorded run, once it finished."""
        return self._stream.record

    @property
    def run_dir(self) -> Path | None:
        """The run directory of a recorded run, once it finished."""
        return self._stream.run_dir

    def stats(self) -> StreamStats | None:
        """The bounded stream's counters, as RunStream.stats()."""
        return self._stream.stats()

    def __iter__(self) -> Iterator[RunEvent]:
        if self._iterator is None:
            self._iterator = self._events()
        return self._iterator

    def __enter__(self) -> SyncRunStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the run if it is still going, and wait until its thread ended."""
        if self._iterator is not None:
            self._iterator.close()  # type: ignore[attr-defined]

    async def _pump(self) -> None:
        self._token = anyio.lowlevel.current_token()
        with anyio.CancelScope() as scope:
            self._scope = scope
            self._ready.set()
            async with self._stream as events:
                async for event in events:
                    # a worker thread waits for room, so a slow caller holds the run back
                    await anyio.to_thread.run_sync(self._queue.put, (True, event))

    def _work(self) -> None:
        try:
            anyio.run(self._pump)
            end: tuple[bool, Any] = (False, None)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            end = (False, error)
        finally:
            self._ready.set()
        self._queue.put(end)

    def _events(self) -> Iterator[RunEvent]:
        self._thread = threading.Thread(target=self._work, name="rclc-graph-stream", daemon=True)
        self._thread.start()
        finished = False
        try:
            while True:
                is_event, item = self._queue.get()
                if is_event:
                    yield item
                    continue
                finished = True
                if item is not None:
                    raise item
                return
        finally:
            if not finished:
                self._stop()

    def _stop(self) -> None:
        self._ready.wait()
        if self._scope is not None and self._token is not None:
            try:
                anyio.from_thread.run_sync(self._scope.cancel, token=self._token)
            except RuntimeError:
                pass  # its loop already ended
        while True:  # take what it still hands over until it says it ended
            is_event, _ = self._queue.get()
            if not is_event:
                break
        assert self._thread is not None
        self._thread.join()


def stream(
    target: Runnable,
    inputs: Mapping[str, Any] | None = None,
    **options: Any,
) -> SyncRunStream:
    """`astream` for synchronous code (same arguments, `answers=` and `functions=` included):
    iterate it for typed events."""
    return SyncRunStream(astream(target, inputs, **options))


def stream_resume(run_dir: str | os.PathLike[str], **options: Any) -> SyncRunStream:
    """`astream_resume` for synchronous code (same arguments: `answers=`, `functions=`, ...):
    continue a waiting or interrupted run and iterate its typed events."""
    return SyncRunStream(astream_resume(run_dir, **options))


__all__ = ["RunStream", "SyncRunStream", "astream", "astream_resume", "plan_for", "stream", "stream_resume"]
