"""Running a plan with a record: the recording executor, model preparation, and the run
functions that leave a run directory behind (also when the run is cancelled or crashes).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

import rclc

from ...executors import DelegatingExecutor, Executor, LocalExecutor, ModelPool, RunContext, default_pool, make_executor
from ...plan.dag import Plan, PlanNode
from ...results.events import EventStream
from ...results.run_result import NodeResult, RunResult
from ..preflight import check_code, check_context
from .writer import RunRecorder
from ..scheduler import is_cancellation, new_run_id, refuse_event_stream, run_plan


class RecordingExecutor(DelegatingExecutor):
    """Wraps an executor: every node's result and snapshot reach disk before the scheduler
    sees it finished, so nodes downstream never start before their senders are recorded.

    (The scheduler's observer hook is synchronous; saving a snapshot is not, so recording
    happens here.) Executors whose `agent()` is None are recorded without snapshots. Every
    other part of the contract goes to the wrapped executor unchanged.
    """

    def __init__(self, inner: Executor, recorder: RunRecorder) -> None:
        super().__init__(inner)
        self.recorder = recorder

    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: list[tuple[Any, NodeResult]]) -> NodeResult:
        self.recorder.started_nodes.add(node.name)
        result = await self.inner.run_node(ctx, node, inbound)
        agent = None if node.is_function else self.inner.agent(ctx.run_id, node.name)  # a function keeps no state
        await self.recorder.save_node(result, agent)
        return result


async def run_recorded(
    plan: Plan,
    out: str | os.PathLike[str] = "runs",
    *,
    seed: int = 0,
    pool: ModelPool | None = None,
    executor: Executor | str | None = None,
    events: EventStream | None = None,
    run_id: str | None = None,
    topology_file: str | os.PathLike[str] | None = None,
    base_dir: Path | None = None,
) -> tuple[RunResult, dict[str, Any], Path]:
    """Run `plan` and record it in `out/<run_id>/`; returns (result, record, run directory).

    With the local executor (the default) the plan's prompts are first checked against
    each model's context with its tokenizer alone (preflight.py), then the models are
    loaded, so a run that cannot work fails before any weights are read and the 'running'
    record already names the models' fingerprints. A cancelled run (or one that crashes)
    still leaves a record of the nodes that finished, with status "cancelled" (or
    "failed"), before the cancellation or error propagates.
    """
    pool = pool if pool is not None else default_pool()
    owned = None
    if isinstance(executor, str):  # a name: make it here and close it when the run ends
        executor = owned = make_executor(executor, pool=pool)
    try:
        if executor is None or isinstance(owned, LocalExecutor):
            await prepare_models(plan, pool, base_dir)
        recorder = RunRecorder(out, plan, run_id=run_id or new_run_id(), seed=seed, topology_file=topology_file,
                               pool=pool, base_dir=base_dir)
        recorder.start()
        inner = executor if executor is not None else LocalExecutor(pool, keep_agents=False)
        return await record_run(recorder, inner, pool=pool, events=events, base_dir=base_dir)
    finally:
        if owned is not None:
            owned.close()


async def prepare_models(plan: Plan, pool: ModelPool, base_dir: Path | None) -> None:
    """Check every prompt fits its context (tokenizers only) and every trusted module:callable
    imports, then load the plan's models."""
    await anyio.to_thread.run_sync(check_code, plan)
    await anyio.to_thread.run_sync(check_context, plan, pool, base_dir)
    for spec in plan.models():
        await anyio.to_thread.run_sync(pool.get, spec, base_dir)


async def record_run(
    recorder: RunRecorder,
    executor: Executor,
    *,
    pool: ModelPool | None,
    events: EventStream | None = None,
    base_dir: Path | None = None,
    completed: dict[str, NodeResult] | None = None,
) -> tuple[RunResult, dict[str, Any], Path]:
    """Run the recorder's plan through `executor`, recording every node, and finish the record
    (also when the run is cancelled or crashes, before that propagates)."""
    began = time.perf_counter()
    try:
        result = await run_plan(recorder.plan, pool=pool, executor=RecordingExecutor(executor, recorder), events=events,
                                run_id=recorder.run_id, seed=recorder.seed, base_dir=base_dir, completed=completed)
    except BaseException as error:
        stopped = isinstance(error, KeyboardInterrupt) or is_cancellation(error)
        partial = recorder.partial_result(
            "cancelled" if stopped else "failed",
            "cancelled before the run finished" if stopped else f"{type(error).__name__}: {error}",
            time.perf_counter() - began,
        )
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(recorder.finish, partial)
        raise
    record = await anyio.to_thread.run_sync(recorder.finish, result)
    return result, record, recorder.run_dir


def run_recorded_sync(plan: Plan, out: str | os.PathLike[str] = "runs", **options: Any) -> tuple[RunResult, dict[str, Any], Path]:
    """`run_recorded` from synchronous code; inside a running event loop (a Jupyter cell) the
    run gets a loop of its own in a worker thread (`rclc.call_sync`)."""
    refuse_event_stream("run_recorded_sync", options)
    return rclc.call_sync(run_recorded, plan, out, **options)

