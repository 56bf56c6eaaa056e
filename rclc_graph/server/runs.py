"""The server's runs: bounded admission, execution through the library's own run functions, the
event log of every run directory, and what a run's state is after a restart.

A run lives in its run directory (`<runs>/<run_id>/`, written by `run_recorded` and
`resume_run` exactly as `rclc-graph run` and `resume` write it) plus `events.jsonl`, the
typed events the server appends as the run publishes them. Nothing else is needed to list,
watch or resume it, so a server that was killed and started again shows every run: those it
was running are `interrupted` (their record still says running, and no process holds them)
and resume like any interrupted run. A run admitted but not started yet has no directory: its
submission waits in `<runs>/.serve/submissions/<run_id>.json` (submissions.py) and is queued
again at start.

Admission: at most `max_concurrent` runs execute; up to `max_queue` more wait; beyond that a
submission is refused with 429 and a Retry-After estimated from recent run times.
"""

from __future__ import annotations

import logging
import math
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import anyio
from anyio.abc import TaskGroup

from ..errors import ErrorCode
from ..plan.dag import Plan
from ..executors import ModelPool
from ..run import RunSettings, new_run_id, prepare_run, read_record, read_resume_point, record_with, resume_run
from ..run.event_log import EventLogWriter
from ..run.streaming import RunStream
from .attempts import FailedAttempts
from .errors import ApiError
from .settings import ServerSettings
from .submissions import Submission, SubmissionStore

logger = logging.getLogger(__name__)

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SERVER_DIR = ".serve"
TERMINAL_RECORD = ("finished", "failed", "cancelled", "waiting")


@dataclass
class ActiveRun:
    """A run executing here: `starting` until its first event (models loading), then `running`."""

    submission: Submission
    status: str = "starting"
    stream: RunStream | None = None
    cancel_requested: bool = False


class RunManager:
    """Admits, runs, cancels and resumes runs; reads their state from the run directory."""

    def __init__(self, settings: ServerSettings, pool: ModelPool) -> None:
        self.settings = settings
        self.pool = pool
        self.runs_dir = settings.runs_dir.resolve()
        self.submissions = SubmissionStore(self.runs_dir / SERVER_DIR / "submissions")
        self.attempts = FailedAttempts(self.runs_dir / SERVER_DIR / "attempts", self.runs_dir)
        self.queue: deque[Submission] = deque()
        self.active: dict[str, ActiveRun] = {}
        self.recent_seconds: deque[float] = deque(maxlen=16)
        self.streams = 0  # open SSE connections
        self._changed: dict[str, anyio.Event] = {}
        self._group: TaskGroup | None = None
        self._summaries: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}

    # -- lifetime ------------------------------------------------------------------------------

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled: queue the submissions a previous server left, start runs."""
        self.submissions.directory.mkdir(parents=True, exist_ok=True)
        async with anyio.create_task_group() as group:
            self._group = group
            for submission in self.submissions.pending(self.runs_dir, trust_code=self.settings.trust_code):
                self.queue.append(submission)
                logger.info("queued run %s again (admitted by an earlier server)", submission.run_id)
            self._start_next()
            task_status.started()
            await anyio.sleep_forever()

    async def shutdown(self, grace_seconds: float = 30.0) -> None:
        """Cancel every active run and wait (up to `grace_seconds`) until each recorded what it finished."""
        for active in self.active.values():
            self._cancel_active(active)
        self.queue.clear()  # their submissions stay on disk and are queued again at the next start
        with anyio.move_on_after(grace_seconds):
            while self.active:
                await anyio.sleep(0.05)

    # -- admission -----------------------------------------------------------------------------

    def admit(self, submission: Submission) -> dict[str, Any]:
        """Start the run now, queue it, or refuse it with 429 and Retry-After."""
        if len(self.active) < self.settings.max_concurrent and not self.queue:
            self._start(submission)
            return {"run_id": submission.run_id, "status": "starting"}
        if len(self.queue) >= self.settings.max_queue:
            wait = self.retry_after()
            raise ApiError(
                429, ErrorCode.E_BUSY,
                f"the server runs {len(self.active)} runs and {len(self.queue)} wait, its limits "
                f"(--max-concurrent {self.settings.max_concurrent}, --max-queue {self.settings.max_queue})",
                f"retry after {wait} seconds", headers={"Retry-After": str(wait)})
        self.queue.append(submission)
        self._notify(submission.run_id)
        return {"run_id": submission.run_id, "status": "queued", "position": len(self.queue)}

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: recent run times, the queue, the slots."""
        if not self.recent_seconds:
            return self.settings.retry_after
        mean = sum(self.recent_seconds) / len(self.recent_seconds)
        return max(1, min(300, math.ceil(mean * (len(self.queue) + 1) / self.settings.max_concurrent)))

    def _start_next(self) -> None:
        while self.queue and len(self.active) < self.settings.max_concurrent:
            self._start(self.queue.popleft())

    def _start(self, submission: Submission) -> None:
        if self._group is None:
            raise ApiError(503, ErrorCode.E_UNAVAILABLE, "the server is starting or stopping", "retry in a moment")
        self.active[submission.run_id] = ActiveRun(submission)
        self._notify(submission.run_id)
        self._group.start_soon(self._execute, submission, name=f"run {submission.run_id}")

    # -- submissions ---------------------------------------------------------------------------

    def submit_new(self, plan: Plan, *, topology: str | None, topology_file: Path | None, seed: int) -> dict[str, Any]:
        """Admit a new run of `plan`; its submission is on disk until the run has a directory."""
        base_dir = self.settings.topologies_dir.resolve() if topology_file is None else topology_file.resolve().parent
        submission = Submission(new_run_id(), "new", plan=plan, topology=topology, topology_file=topology_file,
                                base_dir=base_dir, seed=seed, preflighted=True)  # the handler preflighted it
        if len(self.queue) >= self.settings.max_queue and len(self.active) >= self.settings.max_concurrent:
            return self.admit(submission)  # refused: nothing written
        self.submissions.write(submission, "queued")
        try:
            return self.admit(submission)
        except ApiError:
            self.submissions.remove(submission.run_id)
            raise

    async def submit_resume(self, run_id: str, answers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Admit a resume of an unfinished run (checked first, without loading a model)."""
        self._check_resumable(run_id, answers)
        record = await anyio.to_thread.run_sync(self.record, run_id)
        if not self.settings.trust_code and ((record or {}).get("plan") or {}).get("trust_code") is True:
            # a record's seal lets `rclc-graph resume` skip --trust-code (run/record/trust_seal.py); a server
            # started without --trust-code imports no code, whoever started the run
            raise ApiError(422, ErrorCode.E_REQUEST, f"run {run_id} imports code its topology names (it started with trust_code)",
                           "start the server with --trust-code to resume it, or resume it with rclc-graph resume")
        options = {} if answers is None else {"answers": dict(answers)}
        await anyio.to_thread.run_sync(
            lambda: read_resume_point(self.run_dir(run_id), trust_code=self.settings.trust_code, **options))
        self._check_resumable(run_id, answers)  # again: another request may have resumed it meanwhile
        kind = "resume" if answers is None else "answer"
        return self.admit(Submission(run_id, kind, answers=None if answers is None else dict(answers)))

    def _check_resumable(self, run_id: str, answers: Mapping[str, str] | None) -> None:
        status = self.status(run_id)
        if status in ("queued", "starting", "running"):
            raise ApiError(409, ErrorCode.E_STATE, f"run {run_id} is {status}", "wait until it ended, or cancel it")
        if status == "finished":
            raise ApiError(409, ErrorCode.E_STATE, f"run {run_id} finished; there is nothing to resume", "start a new run")
        if answers is None and status == "waiting":
            raise ApiError(409, ErrorCode.E_STATE, f"run {run_id} waits for an answer", f"POST /runs/{run_id}/answer")
        if answers is not None and status != "waiting":
            raise ApiError(409, ErrorCode.E_STATE, f"run {run_id} is {status}, not waiting for an answer",
                           f"POST /runs/{run_id}/resume")

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Cancel a queued run (it never starts) or an active one (it records what finished)."""
        for submission in list(self.queue):
            if submission.run_id == run_id:
                self.queue.remove(submission)
                if submission.kind == "new":
                    self.submissions.write(submission, "cancelled")
                self._notify(run_id)
                return {"run_id": run_id, "status": "cancelled"}
        active = self.active.get(run_id)
        if active is None:
            raise ApiError(409, ErrorCode.E_STATE, f"run {run_id} is {self.status(run_id)}, not queued or running",
                           "only queued and running runs can be cancelled")
        self._cancel_active(active)
        return {"run_id": run_id, "status": "cancelling"}

    def _cancel_active(self, active: ActiveRun) -> None:
        active.cancel_requested = True
        if active.stream is not None:
            active.stream.cancel()

    # -- execution -----------------------------------------------------------------------------

    async def _execute(self, submission: Submission) -> None:
        active = self.active[submission.run_id]
        writer: EventLogWriter | None = None
        try:
            stream = active.stream = RunStream(self._starter(submission), max_events=self.settings.stream_events,
                                               max_bytes=self.settings.stream_bytes)
            if active.cancel_requested:
                stream.cancel()
            async with stream:
                async for event in stream:
                    if writer is None:  # the first event: the run directory exists now
                        writer = EventLogWriter(self.run_dir(submission.run_id)).open()
                        self.submissions.remove(submission.run_id)
                        self.attempts.clear(submission.run_id)
                        active.status = "running"
                    await writer.append(event)
                    self._notify(submission.run_id)
            if stream.result is not None:
                self.recent_seconds.append(stream.result.seconds)
            logger.info("run %s ended: %s", submission.run_id,
                        "cancelled" if stream.cancelled else getattr(stream.result, "status", "?"))
        except Exception as error:  # noqa: BLE001 - kept where the API shows it (the record, or below)
            message = f"{type(error).__name__}: {error}"
            if writer is None and submission.kind == "new":
                logger.warning("run %s could not start: %s", submission.run_id, error)
                self.submissions.write(submission, "failed", message)
            else:
                logger.exception("run %s raised", submission.run_id)
                if submission.kind != "new":  # a resume the run could not record: say why in the API
                    self.attempts.record(submission.run_id, submission.kind, message)
        finally:
            if writer is not None:
                writer.close()
            del self.active[submission.run_id]
            self._notify(submission.run_id)
            self._start_next()

    def _starter(self, submission: Submission) -> Any:
        settings = self.settings
        if submission.kind == "new":
            plan = submission.plan
            assert plan is not None  # a new run's submission holds its plan (submissions.py)

            async def start(events: Any) -> Any:
                run = RunSettings.build(pool=self.pool, base_dir=submission.base_dir)
                try:
                    if submission.preflighted:  # at admission: only the models are left to load
                        await run.executor.prepare(plan, run.base_dir)
                    else:  # queued again after a restart: check it again first
                        await prepare_run(plan, run)
                    return await record_with(run, plan, self.runs_dir, seed=submission.seed, events=events,
                                             run_id=submission.run_id, topology_file=submission.topology_file)
                finally:
                    run.close()
            return start
        options: dict[str, Any] = {} if submission.answers is None else {"answers": submission.answers}

        async def resume(events: Any) -> Any:
            return await resume_run(self.run_dir(submission.run_id), pool=self.pool, events=events,
                                    trust_code=settings.trust_code, **options)
        return resume

    # -- state ---------------------------------------------------------------------------------

    def run_dir(self, run_id: str) -> Path:
        """The directory of run `run_id` (400 for an id that could leave the runs directory)."""
        if not _RUN_ID.match(run_id) or run_id == SERVER_DIR:
            raise ApiError(400, ErrorCode.E_REQUEST, f"run_id: {run_id!r} is not a run id", "use an id GET /runs lists")
        return self.runs_dir / run_id

    def status(self, run_id: str) -> str:
        """queued | starting | running | finished | failed | cancelled | waiting | interrupted;
        404 for a run this server does not know."""
        if any(submission.run_id == run_id for submission in self.queue):
            return "queued"
        if run_id in self.active:
            return self.active[run_id].status
        record = self.record(run_id)
        if record is not None:
            return "interrupted" if record.get("status") == "running" else str(record.get("status"))
        submission = self.submissions.read(self.run_dir(run_id).name)
        if submission is not None:
            return str(submission.get("status"))
        raise ApiError(404, ErrorCode.E_NOT_FOUND, f"no run {run_id!r} in {self.runs_dir}", "GET /runs lists the runs")

    def live(self, run_id: str) -> bool:
        """Whether the run is queued or executing here (its event log may still grow)."""
        return run_id in self.active or any(submission.run_id == run_id for submission in self.queue)

    def record(self, run_id: str) -> dict[str, Any] | None:
        """The run's record.json, or None when it has no directory (yet)."""
        directory = self.run_dir(run_id)
        if not (directory / "record.json").is_file():
            return None
        return read_record(directory)

    def summary(self, run_id: str) -> dict[str, Any]:
        """What a list shows of one run (records read once per change of record.json)."""
        status = self.status(run_id)
        path = self.run_dir(run_id) / "record.json"
        entry: dict[str, Any] = {"run_id": run_id, "status": status}
        try:
            stat = path.stat()
        except FileNotFoundError:
            submission = self.submissions.read(run_id) or {}
            entry.update(graph=submission.get("graph"), error=submission.get("error"),
                         started_at=submission.get("submitted_at"))
            return entry
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._summaries.get(run_id)
        if cached is None or cached[0] != key:
            record = read_record(path.parent)
            cached = (key, {"graph": record.get("graph"), "error": record.get("error"),
                            "started_at": (record.get("timings") or {}).get("started_at"),
                            "seconds": (record.get("timings") or {}).get("seconds"),
                            "nodes": len(record.get("nodes") or {}),
                            "plan_nodes": len((record.get("plan") or {}).get("nodes") or []),
                            "outputs": record.get("outputs") or {},
                            "report": (path.parent / "report.html").is_file()})
            self._summaries[run_id] = cached
        entry.update(cached[1])
        attempt = self.attempts.read(run_id)
        if attempt is not None and status not in ("queued", "starting", "running"):
            entry["error"] = f"{attempt['kind']} failed: {attempt['error']}"
        return entry

    def error(self, run_id: str) -> str | None:
        """Why the run's last attempt failed: a resume it could not record, else its record's error."""
        if self.status(run_id) not in ("queued", "starting", "running"):
            attempt = self.attempts.read(run_id)
            if attempt is not None:
                return f"{attempt['kind']} failed: {attempt['error']}"
        record = self.record(run_id)
        error = None if record is None else record.get("error")
        return error if isinstance(error, str) else None

    def run_ids(self) -> list[str]:
        """Every run this server knows: directories, submissions, the queue; newest first."""
        found = {path.name for path in self.runs_dir.iterdir()
                 if path.is_dir() and path.name != SERVER_DIR and (path / "record.json").is_file()}
        found.update(self.submissions.run_ids())
        found.update(submission.run_id for submission in self.queue)
        found.update(self.active)
        return sorted(found, reverse=True)

    def changed(self, run_id: str) -> anyio.Event:
        """An event set at the next change of the run (an event logged, a state change); take it
        before reading, so no change between the read and the wait is missed."""
        event = self._changed.get(run_id)
        if event is None:
            event = self._changed[run_id] = anyio.Event()
        return event

    def _notify(self, run_id: str) -> None:
        event = self._changed.pop(run_id, None)
        if event is not None:
            event.set()

