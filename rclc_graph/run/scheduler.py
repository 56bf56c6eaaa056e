"""The anyio run loop: start every node whose senders settled, collect results, publish events.

Planning is the plan's pure `ready()`; this module only runs what it says. A node is ready
once everything its inbound edges wait for is settled (finished or skipped); routing.py
then decides from the finished outputs whether it runs (at least one inbound edge fired,
or it has none) or is skipped, and skipping propagates. A node that runs does so in its
own task, so independent branches overlap (their generations on one model decode together
in its batches; the transfer core runs other model work one forward at a time per model).
A failing node cancels the rest of the run; cancelling the run stops generation at the
next step, waits for worker threads, retires the run's event epoch and re-raises. Where a
node executes is the executor's business (`LocalExecutor` in-process; others can place
nodes elsewhere).

A node that waits for a person (`interrupt: before` without an answer, `interrupt: after`
once it finished, or a function that raised `Interrupt`) stops the run: nodes already
running finish and are recorded, nothing new starts, and the run ends with status
"waiting" (interrupts.py); a resume with an answer continues from there.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.lowlevel

import rclc

from ..errors import Interrupt, NodeFailed, ObserverFailed, UsageError, node_failed
from ..executors.contract import Executor, RunContext
from ..executors.mcp_servers import servers_for
from ..executors.pool import ModelPool
from ..executors.trusted_code import search_beside
from ..plan.dag import Plan, PlanNode
from ..plan.runtime_foreach import edge_with_item, with_item
from ..results.events import EventStream
from ..results.lineage import HopRecord
from ..results.run_result import NodeResult, RunResult
from .interrupts import Waiting, with_answers
from .routing import Routing
from .settings import RunSettings
from .tracing import run_tracer

logger = logging.getLogger(__name__)


class RunObserver(Protocol):
    """Told about node completions as they happen (records, progress bars)."""

    def node_finished(self, run_id: str, result: NodeResult) -> None: ...


def new_run_id() -> str:
    """`YYYYmmdd-HHMMSS-ffffrr`: the start time, then 4 hex digits of the second's fraction (so
    runs started in the same second sort, and list, in the order they started) and 2 random
    ones (runs of other processes in the same 1/65536 s)."""
    now = time.time()
    fraction = int((now % 1) * 65536)
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{fraction:04x}" + uuid.uuid4().hex[:2]


class _Publisher:
    """Publishes the run's events into an optional stream, under the run's epoch, and shows
    each to the run's tracer (OpenTelemetry spans, when the `otel` extra is installed)."""

    def __init__(self, events: EventStream | None, run_id: str, plan: Plan | None = None, seed: int = 0) -> None:
        self.events, self.run_id = events, run_id
        self.epoch = events.open_epoch() if events is not None else 0
        self.tracer = run_tracer(run_id, plan, seed)
        self.quiet = events is None and self.tracer is None  # nobody reads this run's events

    async def __call__(self, kind: str, payload: dict[str, Any]) -> Any:
        if self.tracer is not None:
            self.tracer.observe(kind, payload)
        if self.events is None:
            return None
        return await self.events.publish(kind, payload, run_id=self.run_id, epoch=self.epoch)  # type: ignore[arg-type]

    def node_result(self, name: str, inbound: list[tuple[Any, NodeResult]], result: NodeResult) -> None:
        """Show a finished node's result to the tracer (its model calls' spans), before its event."""
        if self.tracer is not None:
            self.tracer.node_result(name, inbound, result)

    def trace(self, kind: str, payload: dict[str, Any]) -> None:
        """Show an event to the tracer only (the run ended without a stream event for it)."""
        if self.tracer is not None:
            self.tracer.observe(kind, payload)

    async def cancelled(self, finished: list[str]) -> None:
        """The run was cancelled: retire its epoch and queue its one `cancelled` notice."""
        payload = {"finished": finished}
        if self.tracer is not None:
            self.tracer.observe("cancelled", payload)
        if self.events is not None:
            await self.events.cancel(self.epoch, run_id=self.run_id, payload=payload)


async def run_plan(
    plan: Plan,
    *,
    pool: ModelPool | None = None,
    executor: Executor | str | None = None,
    events: EventStream | None = None,
    run_id: str | None = None,
    seed: int = 0,
    base_dir: Path | None = None,
    completed: dict[str, NodeResult] | None = None,
    observer: RunObserver | None = None,
) -> RunResult:
    """Run every node of `plan` once; return outputs, per-node results and per-hop records.

    `completed` holds results of nodes that already finished (resume): they are not run
    again, and the executor must already hold their state. A node failure ends the run
    with status "failed" (the error names node, edge and cause); a node that waits for a
    person ends it with status "waiting" (`RunResult.waiting` says who and what is asked);
    cancellation propagates.
    `executor` is an executor object or a name ("local", "ray": see rclc_graph.executors);
    one made from a name here is closed when the run ends.
    """
    settings = RunSettings.build(pool=pool, executor=executor, base_dir=base_dir)
    try:
        return await run_with(settings, plan, events=events, run_id=run_id, seed=seed, completed=completed,
                              observer=observer)
    finally:
        settings.close()


async def run_with(
    settings: RunSettings,
    plan: Plan,
    *,
    events: EventStream | None = None,
    run_id: str | None = None,
    seed: int = 0,
    completed: dict[str, NodeResult] | None = None,
    observer: RunObserver | None = None,
) -> RunResult:
    """`run_plan` on settings a view built once (the pool, executor and base_dir of its runs)."""
    executor = settings.executor
    base_dir = settings.base_dir
    search_beside(base_dir if plan.trust_code else None)  # modules beside a trusted topology import
    run_id = run_id or new_run_id()
    publish = _Publisher(events, run_id, plan, seed)
    servers = servers_for(plan, base_dir)  # MCP servers start on first use and stop when the run ends
    ctx = RunContext(run_id=run_id, plan=plan, publish=publish, seed=seed, base_dir=base_dir, tool_servers=servers)
    results: dict[str, NodeResult] = with_answers(plan, dict(completed or {}))
    walk = _Walk(plan, executor, ctx, results, observer)
    begun = time.perf_counter()
    logger.info("run %s (%s, %d nodes, %d done before) started", run_id, plan.name, len(plan.nodes), len(results))
    await publish("run", {"status": "started", "plan": plan.name, "nodes": len(plan.nodes), "resumed": len(results)})
    failure: NodeFailed | None = None
    try:
        async with servers if servers is not None else contextlib.nullcontext():
            await walk.drive()
    except BaseException as error:
        ctx.stop.set()
        if is_cancellation(error):
            logger.info("run %s cancelled; finished: %s", run_id, ", ".join(sorted(results)) or "none")
            with anyio.CancelScope(shield=True):
                await publish.cancelled(sorted(results))
            executor.release(run_id)
            raise
        failure = _first(error, NodeFailed)
        if failure is None:
            logger.error("run %s raised %s: %s", run_id, type(error).__name__, error)
            publish.trace("run", {"status": "failed", "error": f"{type(error).__name__}: {error}"})
            executor.release(run_id)
            raise
    seconds = time.perf_counter() - begun
    hops = _hops_in_order(plan, results)
    waiting = walk.waiting.described(plan, results, walk.routing.fired)
    outputs = {plan.output_key(name): results[name].effective_text for name in plan.outputs
               if name in results and name not in walk.waiting}
    fired = {plan.edges[edge].key: decision for edge, decision in sorted(walk.routing.fired.items())}
    common: dict[str, Any] = dict(seconds=seconds, skipped=dict(walk.skipped), fired=fired)
    if failure is not None:
        logger.warning("run %s failed after %.2f s: %s", run_id, seconds, failure)
        await publish("error", {"node": failure.node, "edge": None if failure.edge is None else failure.edge.id,
                                "message": str(failure)})
        await publish("run", {"status": "failed", "seconds": seconds, "error": str(failure), "node": failure.node})
        executor.release(run_id)
        return RunResult(run_id, "failed", outputs, results, hops, error=str(failure), failed_node=failure.node,
                         waiting=waiting, **common)
    if waiting:
        logger.info("run %s waits for an answer at %s after %.2f s", run_id, waiting[0]["node"], seconds)
        await publish("run", {"status": "waiting", "node": waiting[0]["node"], "question": waiting[0]["question"]})
        return RunResult(run_id, "waiting", outputs, results, hops, waiting=waiting, **common)
    logger.info("run %s finished in %.2f s", run_id, seconds)
    await publish("run", {"status": "finished", "seconds": seconds, "outputs": outputs})
    return RunResult(run_id, "finished", outputs, results, hops, **common)


_Step = tuple[PlanNode, list[tuple[Any, NodeResult]]]  # a node to run now, with its inbound (edge, result) pairs


class _Walk:
    """One run's walk over its plan: which nodes settled (finished or skipped), which run,
    which wait for a person; `drive` runs it to its end.

    A node's task settles the node itself when it finishes and goes on with the first node
    that made ready (a chain runs in one task); only further ready nodes get tasks of their
    own. Settling costs only what the node's plan uses: a plain edge is decided by one
    membership test, and routing, loops, interrupts and events cost nothing on the path of
    a node that has none of them (benchmarks/scheduler_overhead.py)."""

    def __init__(self, plan: Plan, executor: Executor, ctx: RunContext, results: dict[str, NodeResult],
                 observer: RunObserver | None) -> None:
        self.plan, self.executor, self.ctx, self.results, self.observer = plan, executor, ctx, results, observer
        self.skipped: dict[str, str] = {}
        self.routing = Routing(plan, results, self.skipped, ctx.publish)
        self.waiting = Waiting()
        self.started: set[str] = set(results)
        self.settled: set[str] = set()
        self.running = 0
        self._group: Any = None
        self._quiet = isinstance(ctx.publish, _Publisher) and ctx.publish.quiet  # nothing reads events
        self._answered = any(node.interrupt == "after" for node in plan.nodes)
        # receivers not settled yet, per node, when the executor wants to hear that a state is no longer read
        self._unsettled_receivers: dict[str, int] | None = None
        if type(executor).consumed is not Executor.consumed:
            self._unsettled_receivers = {node.name: len(set(plan.receivers(node.name))) for node in plan.nodes}

    async def drive(self) -> None:
        """Run every node that can run now; return when none is running and none can start."""
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._stop_generation_on_cancel)
            for name in list(self.results):  # finished before (resume): settled, unless waiting for an answer
                if self._waits_after(name):
                    await self._wait(name, "after", self.plan.node(name).question or "")
                else:
                    self.settled.add(name)
            first = await self._advance(self.plan.ready(self.settled, self.started))
            if first is not None:
                self._spawn(*first)
            if not self.running:
                group.cancel_scope.cancel()  # only the watcher is left
        if not self.waiting and len(self.settled) < len(self.plan.nodes):  # pragma: no cover - a planning bug
            left = [name for name in self.plan.order if name not in self.settled]
            raise RuntimeError(f"the run stopped with nodes neither finished nor skipped: {', '.join(left)}")

    def _spawn(self, node: PlanNode, inbound: list[tuple[Any, NodeResult]]) -> None:
        self.running += 1
        self._group.start_soon(self._run_from, node, inbound, name=f"node {node.name}")

    async def _advance(self, names: tuple[str, ...] | list[str]) -> _Step | None:
        """Skip, hold or start each ready node; a skip settles at once and may ready more.
        The first node to run is returned (its caller runs it in its own task), the others
        get tasks of their own."""
        queue = list(names)
        first: _Step | None = None
        while queue:
            name = queue.pop(0)
            if name in self.started:
                continue
            fired, reason = await self.routing.decide(name)
            if name in self.started:  # decided by another task meanwhile (routing awaited)
                continue
            if reason is not None:
                self.skipped[name] = reason
                self.started.add(name)
                await self.ctx.publish("node", {"node": name, "status": "skipped", "reason": reason})
                queue += self._settle(name)
                continue
            node = await self._with_item(self.plan.node(name))
            if name in self.started:  # started by another task meanwhile (reading the list awaited)
                continue
            if node.interrupt == "before" and node.answer is None:
                self.started.add(name)
                await self._wait(name, "before", node.question or "")
                continue
            if self.waiting:
                continue  # a person is asked: nothing new starts (a resume with the answer starts it)
            self.started.add(name)
            if node.foreach_from is not None and node.item is not None:  # requests may read the item too
                fired = [edge_with_item(self.plan, edge, node, node.item) for edge in fired]
            inbound = [(edge, self.results[edge.source]) for edge in fired]
            if first is None:
                first = (node, inbound)
            else:
                self._spawn(node, inbound)
        return first

    async def _with_item(self, node: PlanNode) -> PlanNode:
        """A run-time foreach copy with its item (its producer settled: routing read the list)."""
        if node.foreach_from is None or node.index is None:
            return node
        items = await self.routing.items(node)
        return node if items is None or node.index >= len(items) else with_item(self.plan, node, items[node.index])

    async def _run_from(self, node: PlanNode, inbound: list[tuple[Any, NodeResult]]) -> None:
        """Run `node`, settle it, and go on with the first node it made ready, in this task."""
        step: _Step | None = (node, inbound)
        while step is not None:
            node, inbound = step
            name = node.name
            try:
                await self._run_one(node, inbound)
            except Interrupt as raised:  # a function node asked for a person: it did not finish
                await self._wait(name, "raised", raised.question)
                step = None
                continue
            if self._answered and self._waits_after(name):
                await self._wait(name, "after", self.plan.node(name).question or "")
                step = None
                continue
            step = await self._advance(self._settle(name))
            if step is not None:  # a chain of nodes that never wait must still let other tasks run
                await anyio.lowlevel.checkpoint()
        self.running -= 1
        if not self.running:
            self._group.cancel_scope.cancel()  # every node settled or waits: only the watcher is left

    async def _run_one(self, node: PlanNode, inbound: list[tuple[Any, NodeResult]]) -> None:
        ctx, name = self.ctx, node.name
        quiet = self._quiet
        if not quiet:
            await ctx.publish("node", {"node": name, "status": "started"})
        hops = None if quiet else _HopTracker(ctx.publish)
        with node_failed(name):
            result = await self.executor.run_node(ctx if hops is None else replace(ctx, publish=hops), node, inbound)
        if node.interrupt == "after":
            result = with_answers(self.plan, {name: result})[name]
        self.results[name] = result
        if hops is not None:
            await hops.publish_missing(result.hops)
            if isinstance(ctx.publish, _Publisher):
                ctx.publish.node_result(name, inbound, result)
            await ctx.publish("node", _finished_payload(result))
        if self.observer is not None:
            try:
                self.observer.node_finished(ctx.run_id, result)
            except Exception as error:  # a broken callback fails the run like a broken node
                raise NodeFailed(name, ObserverFailed(f"observer {type(self.observer).__name__}.node_finished raised "
                                                      f"{type(error).__name__}: {error}")) from error

    async def _stop_generation_on_cancel(self) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            self.ctx.stop.set()  # ends native generation at its next step, so cancellation is prompt

    def _settle(self, name: str) -> list[str] | tuple[str, ...]:
        self.settled.add(name)
        if self._unsettled_receivers is not None:
            self._release_read_states(name)
        return self.plan.ready_after(name, self.settled, self.started)  # O(who waits for it), not O(plan)

    def _release_read_states(self, name: str) -> None:
        """Tell the executor of every state no receiver will read any more: `name`'s own when
        it sends to nobody, and each sender's once `name` was the last of its receivers."""
        left = self._unsettled_receivers
        assert left is not None
        consumed = self.executor.consumed
        if left[name] == 0:
            consumed(self.ctx.run_id, name)
        for sender in set(self.plan.senders(name)):
            left[sender] -= 1
            if left[sender] == 0:
                consumed(self.ctx.run_id, sender)

    def _waits_after(self, name: str) -> bool:
        node = self.plan.node(name)
        return node.interrupt == "after" and node.answer is None and name in self.results

    async def _wait(self, name: str, when: str, question: str) -> None:
        self.waiting.add(name, when, question)
        await self.ctx.publish("node", {"node": name, "status": "waiting", "question": question})


class _HopTracker:
    """A node's publish: passes every event on and remembers which hops the executor published
    (when the receiver had its delivery, before it generated), so the scheduler publishes
    only the ones an executor left out, once the node finished."""

    def __init__(self, publish: Any) -> None:
        self.publish = publish
        self.published: set[tuple[Any, str]] = set()

    async def __call__(self, kind: str, payload: dict[str, Any]) -> Any:
        if kind == "hop":
            self.published.add((payload.get("edge"), str(payload.get("source"))))
        return await self.publish(kind, payload)

    async def publish_missing(self, hops: list[HopRecord]) -> None:
        for record in hops:
            if (record.edge, record.source) not in self.published:
                await self.publish("hop", record.to_dict())


def _finished_payload(result: NodeResult) -> dict[str, Any]:
    return {"node": result.node, "status": "finished", "positions": result.positions, "text": result.text,
            "generated_tokens": result.generated_tokens, "generation_seconds": result.generation_seconds,
            "inherited_positions": result.inherited_positions, "lineage": result.lineage.summary()}


def _hops_in_order(plan: Plan, results: dict[str, NodeResult]) -> list[HopRecord]:
    hops: list[HopRecord] = []
    for name in plan.order:
        if name in results:
            hops.extend(results[name].hops)
    return hops


def _first(error: BaseException, kind: type) -> Any:
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None


def is_cancellation(error: BaseException) -> bool:
    """Whether `error` is the event loop's cancellation, alone or grouped (every member of an
    exception group a cancellation): a run stopped, not one that failed."""
    if isinstance(error, BaseExceptionGroup):
        return all(is_cancellation(inner) for inner in error.exceptions)
    return isinstance(error, anyio.get_cancelled_exc_class())


def refuse_event_stream(function: str, options: dict[str, Any]) -> None:
    """A sync twin cannot hand an EventStream to its caller: the stream lives on the loop that
    runs the run, and the caller's code waits outside it. Says what to call instead."""
    if options.get("events") is not None:
        raise UsageError(
            f"events: {function} waits for the whole run, so nothing could read the stream while it runs; "
            "iterate rclc_graph.stream(...) (sync) or rclc_graph.astream(...) (async) to watch a run's events"
        )


def run_plan_sync(plan: Plan, **options: Any) -> RunResult:
    """`run_plan` from synchronous code; inside a running event loop (a Jupyter cell) the run
    gets a loop of its own in a worker thread (`rclc.call_sync`)."""
    refuse_event_stream("run_plan_sync", options)
    return rclc.call_sync(run_plan, plan, **options)
