"""Running a plan with a record: the recording executor and the run functions that leave a
run directory behind (also when the run is cancelled or crashes).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

import rclc

from ...executors import DelegatingExecutor, Executor, ModelPool, RunContext
from ...plan.dag import Plan, PlanNode
from ...results.events import EventStream
from ...results.run_result import NodeResult, RunResult
from ..scheduler import is_cancellation, new_run_id, refuse_event_stream, run_with
from ..settings import RunSettings, prepare_run
from .writer import RunRecorder


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
    record already names the models' fingerprints. An executor passed as an object is the
    caller's to prepare (a view that built its `RunSettings` prepares once: `prepare_run`).
    A cancelled run (or one that crashes) still leaves a record of the nodes that finished,
    with status "cancelled" (or "failed"), before the cancellation or error propagates.
    """
    settings = RunSettings.build(pool=pool, executor=executor, base_dir=base_dir)
    try:
        if settings.loads_models_here:
            await prepare_run(plan, settings)
        return await record_with(settings, plan, out, seed=seed, events=events, run_id=run_id,
                                 topology_file=topology_file)
    finally:
        settings.close()


async def record_with(
    settings: RunSettings,
    plan: Plan,
    out: str | os.PathLike[str],
    *,
    seed: int = 0,
    events: EventStream | None = None,
    run_id: str | None = None,
    topology_file: str | os.PathLike[str] | None = None,
) -> tuple[RunResult, dict[str, Any], Path]:
    """`run_recorded` for a view that built its settings and prepared the plan itself."""
    recorder = RunRecorder(out, plan, run_id=run_id or new_run_id(), seed=seed, topology_file=topology_file,
                           pool=settings.pool, base_dir=settings.base_dir)
    recorder.start()
    return await record_run(recorder, settings, events=events)


async def record_run(
    recorder: RunRecorder,
    settings: RunSettings,
    *,
    events: EventStream | None = None,
    completed: dict[str, NodeResult] | None = None,
) -> tuple[RunResult, dict[str, Any], Path]:
    """Run the recorder's plan through the settings' executor, recording every node, and finish
    the record (also when the run is cancelled or crashes, before that propagates)."""
    began = time.perf_counter()
    recording = replace(settings, executor=RecordingExecutor(settings.executor, recorder), owns_executor=False)
    try:
        result = await run_with(recording, recorder.plan, events=events, run_id=recorder.run_id, seed=recorder.seed,
                                completed=completed)
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

