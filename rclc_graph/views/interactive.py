"""Running one plan from a terminal: the run, a progress view reading its events, and Ctrl-C.

The run and the view are two tasks of one task group; the run's EventStream connects
them. The first Ctrl-C (SIGINT or SIGTERM) cancels the run's scope: the scheduler stops
generation at the next token, `run_recorded` records the nodes that finished, and the
command reports what finished.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.text import Text

from ..executors import Executor, ModelPool
from ..plan.dag import Plan
from ..results.events import EventStream
from ..run import ResumePoint, RunSettings, new_run_id, read_record, record_with, resume_run
from .terminal import ProgressView


class _Interrupt:
    """Turns the first Ctrl-C into cancelling the run (the scheduler stops generation at the
    next token and records what finished); the handler lives only while a run is going."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self.requested = False

    async def watch(self, scope: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only; elsewhere Ctrl-C keeps its default
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if self.console is not None:
                    message = "stopping: waiting for the current model step" if self.requested else (
                        "interrupted: cancelling the run (finished nodes stay recorded)"
                    )
                    self.console.print(Text(message, style="yellow"))
                self.requested = True
                scope.cancel()


async def execute(
    plan: Plan,
    settings: RunSettings,
    *,
    out: Path,
    seed: int,
    topology: Path | None,
    console: Console,
    quiet: bool,
    run_id: str | None = None,
) -> tuple[dict[str, Any], Path, bool]:
    """Run one plan with a record and a progress view; returns (record, run_dir, interrupted).

    `settings` are the command's, built once (the caller preflighted the plan and loaded its
    models: `prepare_run`). The run and a progress view reading its events run side by side;
    the first Ctrl-C cancels the run (its record then says "cancelled" and lists what finished)."""
    run_id = run_id or new_run_id()

    async def start(events: EventStream) -> dict[str, Any]:
        _, record, _ = await record_with(settings, plan, out, seed=seed, events=events, run_id=run_id,
                                         topology_file=topology)
        return record

    return await _interactive(plan, Path(out) / run_id, start, console=console, quiet=quiet)


async def execute_resume(
    point: ResumePoint, *, pool: ModelPool, console: Console, quiet: bool, trust_code: bool,
    executor: Executor | None = None, answers: dict[str, str] | None = None,
) -> tuple[dict[str, Any], Path, bool]:
    """`execute` for a resume (run/resume.py): the same progress view, record and Ctrl-C."""
    async def start(events: EventStream) -> dict[str, Any]:
        _, record, _ = await resume_run(point.run_dir, pool=pool, executor=executor, events=events,
                                        trust_code=trust_code, answers=answers)
        return record

    return await _interactive(point.plan, point.run_dir, start, console=console, quiet=quiet,
                              finished=tuple(point.finished))


async def _interactive(
    plan: Plan, run_dir: Path, start: Any, *, console: Console, quiet: bool, finished: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Path, bool]:
    events = EventStream()
    view = ProgressView(plan, console, quiet=quiet)
    for name in finished:
        view.status[name] = "finished"  # restored from the run directory, not run again
    interrupt = _Interrupt(None if quiet else console)
    record = None
    refused: Exception | None = None  # raised after the task group, as itself (not in a group)
    async with anyio.create_task_group() as group:
        group.start_soon(view.consume, events)
        run_scope = anyio.CancelScope()
        watcher_scope = anyio.CancelScope()

        async def watch() -> None:
            with watcher_scope:
                await interrupt.watch(run_scope)

        group.start_soon(watch)
        try:
            with run_scope:
                record = await start(events)
        except Exception as error:
            refused = error
        finally:
            watcher_scope.cancel()
            events.close()
    if refused is not None:
        raise refused
    if record is None:  # cancelled: run_recorded wrote what finished before cancelling
        record = read_record(run_dir)
    return record, run_dir, interrupt.requested
