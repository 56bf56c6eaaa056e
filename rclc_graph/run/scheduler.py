"""The anyio run loop: start every node whose senders finished, collect results, publish events.

Planning is the plan's pure `ready()`; this module only runs what it says. A node runs in
its own task once all its senders finished, so independent branches overlap (their
generations on one model decode together in its batches; the transfer core runs other
model work one forward at a time per model). A failing node cancels the rest of
the run; cancelling the run stops generation at the next step, waits for worker threads,
retires the run's event epoch and re-raises. Where a node executes is the executor's
business (`LocalExecutor` in-process; others can place nodes elsewhere).
"""

from __future__ import annotations

import functools
import math
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

import anyio

from ..errors import NodeFailed, ObserverFailed
from ..executors import make_executor
from ..executors.contract import Executor, RunContext, require_executor
from ..executors.local import LocalExecutor
from ..executors.pool import ModelPool, default_pool
from ..plan.dag import Plan
from ..results.events import EventStream
from ..results.lineage import HopRecord
from ..results.run_result import NodeResult, RunResult


class RunObserver(Protocol):
    """Told about node completions as they happen (records, progress bars)."""

    def node_finished(self, run_id: str, result: NodeResult) -> None: ...


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


class _Publisher:
    """Publishes the run's events into an optional stream, under the run's epoch."""

    def __init__(self, events: EventStream | None, run_id: str) -> None:
        self.events, self.run_id = events, run_id
        self.epoch = events.open_epoch() if events is not None else 0

    async def __call__(self, kind: str, payload: dict[str, Any]) -> Any:
        if self.events is None:
            return None
        return await self.events.publish(kind, payload, run_id=self.run_id, epoch=self.epoch)  # type: ignore[arg-type]


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
    with status "failed" (the error names node, edge and cause); cancellation propagates.
    `executor` is an executor object or a name ("local", "ray": see rclc_graph.executors);
    one made from a name here is closed when the run ends.
    """
    if isinstance(executor, str):
        owned = make_executor(executor, pool=pool)
        try:
            return await run_plan(plan, pool=pool, executor=owned, events=events, run_id=run_id, seed=seed,
                                  base_dir=base_dir, completed=completed, observer=observer)
        finally:
            owned.close()
    if executor is None:
        executor = LocalExecutor(pool if pool is not None else default_pool())
    require_executor(executor)
    run_id = run_id or new_run_id()
    publish = _Publisher(events, run_id)
    ctx = RunContext(run_id=run_id, plan=plan, publish=publish, seed=seed, base_dir=base_dir)
    results: dict[str, NodeResult] = dict(completed or {})
    begun = time.perf_counter()
    await publish("run", {"status": "started", "plan": plan.name, "nodes": len(plan.nodes), "resumed": len(results)})
    failure: NodeFailed | None = None
    try:
        await _drive(plan, executor, ctx, results, observer)
    except BaseException as error:
        ctx.stop.set()
        if is_cancellation(error):
            if events is not None:
                with anyio.CancelScope(shield=True):
                    await events.cancel(publish.epoch, run_id=run_id, payload={"finished": sorted(results)})
            executor.release(run_id)
            raise
        failure = _first(error, NodeFailed)
        if failure is None:
            executor.release(run_id)
            raise
    seconds = time.perf_counter() - begun
    hops = _hops_in_order(plan, results)
    outputs = {name: results[name].text or "" for name in plan.outputs if name in results}
    if failure is not None:
        await publish("error", {"node": failure.node, "edge": None if failure.edge is None else failure.edge.id,
                                "message": str(failure)})
        await publish("run", {"status": "failed", "seconds": seconds})
        executor.release(run_id)
        return RunResult(run_id, "failed", outputs, results, hops, error=str(failure), seconds=seconds,
                         failed_node=failure.node)
    await publish("run", {"status": "finished", "seconds": seconds, "outputs": outputs})
    return RunResult(run_id, "finished", outputs, results, hops, seconds=seconds)


async def _drive(
    plan: Plan, executor: Executor, ctx: RunContext, results: dict[str, NodeResult], observer: RunObserver | None
) -> None:
    finished = set(results)
    started = set(finished)
    if len(finished) == len(plan.nodes):
        return
    send, receive = anyio.create_memory_object_stream[str](math.inf)

    async def run_one(name: str) -> None:
        node = plan.node(name)
        inbound = [(edge, results[edge.source]) for edge in plan.incoming(name)]
        await ctx.publish("node", {"node": name, "status": "started"})
        try:
            result = await executor.run_node(ctx, node, inbound)
        except NodeFailed:
            raise
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            raise NodeFailed(name, error) from error
        results[name] = result
        for hop in result.hops:
            await ctx.publish("hop", hop.to_dict())
        await ctx.publish("node", {"node": name, "status": "finished", "positions": result.positions,
                                   "text": result.text})
        if observer is not None:
            try:
                observer.node_finished(ctx.run_id, result)
            except Exception as error:  # a broken callback fails the run like a broken node
                raise NodeFailed(name, ObserverFailed(f"observer {type(observer).__name__}.node_finished raised "
                                                      f"{type(error).__name__}: {error}")) from error
        await send.send(name)

    async def stop_generation_on_cancel() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            ctx.stop.set()  # ends native generation at its next step, so cancellation is prompt

    async with send, receive, anyio.create_task_group() as group:
        group.start_soon(stop_generation_on_cancel)

        def launch(names: tuple[str, ...]) -> None:
            for name in names:
                started.add(name)
                group.start_soon(run_one, name, name=f"node {name}")

        launch(plan.ready(finished, started))
        while len(finished) < len(plan.nodes):
            name = await receive.receive()
            finished.add(name)
            launch(plan.ready_after(name, finished, started))  # O(its receivers), not O(plan)
        group.cancel_scope.cancel()  # only the watcher is left


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


def run_plan_sync(plan: Plan, **options: Any) -> RunResult:
    """`run_plan` for code without an event loop."""
    return anyio.run(functools.partial(run_plan, plan, **options))
