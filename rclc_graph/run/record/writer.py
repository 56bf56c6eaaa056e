"""Writing a run directory while the run goes (the format is format.py, its readers reader.py).

`RunRecorder` creates `runs/<run_id>/`, writes a "running" record.json at once, saves each
finished node (snapshot first, node JSON second) and writes the final record.json and
report.html when the run ends. Every file goes through `rclc.files.write_atomic`; the directory
is locked against a second writer for as long as the recorder works in it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

import anyio

from rclc.files import DIRECTORY_MODE, write_atomic, write_json_atomic

from ...executors import ModelPool, model_key
from ...plan.dag import Plan
from ...render.html_report import render_report
from ...results.lineage import HopRecord
from ...results.run_result import NodeResult, RunResult
from ...spec.bounded_json import plain
from ..directory_lock import DirectoryLock
from .format import (
    NODE_FORMAT,
    NODES_DIR,
    RECORD_FILE,
    RECORD_FORMAT,
    RECORD_VERSION,
    REPORT_FILE,
    code_fingerprint,
    safe_name,
    snapshot_identity,
    versions,
)
from .trust_seal import seal
from ...errors import UsageError


logger = logging.getLogger(__name__)




class RunRecorder:
    """Writes one run's directory while it runs; `finish` writes record.json and report.html.

    Give the scheduler `RecordingExecutor(executor, recorder)` (recording.py): after each node
    it has the recorder save the node's result and agent snapshot (`save_node`), then lets
    the scheduler continue. `record.json` is written
    with status "running" by `start()` and replaced by `finish()`; a crashed run therefore
    leaves status "running" next to its finished nodes. `resume()` takes over such a
    directory instead (see resume.py). While it writes, the recorder holds an exclusive
    lock on the directory, released by `finish()`/`close()` or by the process dying.

    Every start or resume is one *attempt*; the record lists them, each with the nodes it
    ran, the finished nodes it reused and those whose state it restored from snapshots.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        plan: Plan,
        *,
        run_id: str,
        seed: int = 0,
        topology_file: str | os.PathLike[str] | None = None,
        pool: ModelPool | None = None,
        base_dir: Path | None = None,
        snapshots: bool = True,
    ) -> None:
        self.plan = plan
        self.run_id = run_id
        self.seed = seed
        self.topology_file = None if topology_file is None else str(topology_file)
        self.pool = pool
        self.base_dir = base_dir
        self.snapshots = snapshots
        self.run_dir = Path(out_dir) / run_id
        self.nodes: dict[str, NodeResult] = {}
        self.snapshot_info: dict[str, dict[str, Any] | None] = {}
        self.started_at = time.time()
        self.started_nodes: set[str] = set()  # nodes this attempt began (finished or not)
        self.attempts: list[dict[str, Any]] = []  # earlier attempts (resume)
        self.attempt: dict[str, Any] = {"started_at": self.started_at, "ran": [], "reused": [], "restored": []}
        self.earlier_seconds = 0.0
        self.earlier_fired: dict[str, bool] = {}  # decisions recorded by earlier attempts (a resume)
        self._trust_seal: str | None = None
        self.lock: DirectoryLock | None = None
        self._created = False

    # where things go
    def node_json(self, node: str) -> Path:
        """Where node `node`'s JSON goes."""
        return self.run_dir / NODES_DIR / f"{safe_name(node)}.json"

    def node_snapshot(self, node: str) -> Path:
        """Where node `node`'s snapshot goes."""
        return self.run_dir / NODES_DIR / f"{safe_name(node)}.safetensors"

    def start(self) -> Path:
        """Create the run directory (refusing an existing one) and write a 'running' record."""
        try:
            self.run_dir.parent.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
        except (FileExistsError, NotADirectoryError):
            raise UsageError(
                f"out: {str(self.run_dir.parent)!r} is not a directory (a file, or a symbolic link to nothing); "
                "pass a directory for the runs"
            ) from None
        try:
            self.run_dir.mkdir(mode=DIRECTORY_MODE)
            (self.run_dir / NODES_DIR).mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            raise UsageError(
                f"out: run directory {str(self.run_dir)!r} already exists; choose another --out or run id"
            ) from None
        self._created = True
        self.lock = DirectoryLock(self.run_dir)
        self.lock.acquire()
        write_json_atomic(self.run_dir / RECORD_FILE, self._record("running", None, None, 0.0))
        return self.run_dir

    def resume(
        self,
        record: Mapping[str, Any],
        finished: Mapping[str, NodeResult],
        snapshot_info: Mapping[str, dict[str, Any] | None],
        *,
        restored: list[str],
        lock: DirectoryLock | None = None,
    ) -> Path:
        """Take over an interrupted run's directory: keep its finished nodes and attempts,
        write a 'running' record, and record this attempt's nodes next to the old ones.

        `lock` is the directory lock the caller already holds (resume.py takes it before
        reading the directory, so nothing can change between the checks and the run).
        """
        self.lock = lock if lock is not None else DirectoryLock(self.run_dir)
        self.lock.acquire()
        self._created = True
        self.nodes = dict(finished)
        self.snapshot_info = dict(snapshot_info)
        timings = record.get("timings") or {}
        self.started_at = float(timings.get("started_at") or self.started_at)
        earlier = [dict(attempt) for attempt in record.get("attempts") or []]
        if not earlier:  # a record from before attempts were listed: one attempt of unknown content
            earlier = [{"started_at": self.started_at, "status": record.get("status"),
                        "seconds": float(timings.get("seconds") or 0.0)}]
        if earlier[-1].get("status") == "running":
            earlier[-1]["status"] = "crashed"  # it never wrote its final record
        self.attempts = earlier
        self.earlier_fired = self._fired_before(record.get("fired"))
        self.earlier_seconds = sum(float(attempt.get("seconds") or 0.0) for attempt in earlier)
        self.attempt = {"started_at": time.time(), "ran": [], "reused": sorted(finished, key=self._order),
                        "restored": sorted(restored, key=self._order)}
        write_json_atomic(self.run_dir / RECORD_FILE, self._record("running", None, None, 0.0))
        return self.run_dir

    def _seal(self) -> dict[str, str]:
        """`trust_seal` for a run with trust_code (trust_seal.py), made once per recorder."""
        if not self.plan.trust_code:
            return {}
        if self._trust_seal is None:
            base_dir = None if self.base_dir is None else str(Path(self.base_dir).resolve())  # as the record says
            self._trust_seal = seal(self.run_id, self.plan.fingerprint(), base_dir) or ""
        return {"trust_seal": self._trust_seal} if self._trust_seal else {}

    def _fired_before(self, fired: Any) -> dict[str, bool]:
        """The decisions an earlier attempt recorded, by "source->target": records written
        before issue 27 keyed them by plan edge id, which the same plan maps back."""
        if not isinstance(fired, Mapping):
            return {}
        keys = {edge.key for edge in self.plan.edges}
        by_id = {str(edge.id): edge.key for edge in self.plan.edges}
        decisions = {}
        for key, decision in fired.items():
            name = key if key in keys else by_id.get(str(key))
            if name is not None and isinstance(decision, bool):
                decisions[name] = decision
        return decisions

    def _fired(self, result: RunResult | None) -> dict[str, bool]:
        """Every conditional edge decided so far (earlier attempts, then this one), in plan order."""
        decided = {**self.earlier_fired, **({} if result is None else result.fired)}
        return {edge.key: decided[edge.key] for edge in self.plan.edges if edge.key in decided}

    def _order(self, name: str) -> int:
        try:
            return self.plan.order.index(name)
        except ValueError:
            return len(self.plan.order)

    def close(self) -> None:
        """Release the directory lock (finish() does it too)."""
        if self.lock is not None:
            self.lock.release()

    async def save_node(self, result: NodeResult, agent: Any | None) -> None:
        """Snapshot first, JSON second (naming the snapshot's SHA-256): the JSON's presence
        with a matching snapshot is what 'finished on disk' means."""
        info: dict[str, Any] | None = None
        if agent is not None and self.snapshots:
            path = self.node_snapshot(result.node)
            await agent.save(path)
            info = await anyio.to_thread.run_sync(snapshot_identity, path)
        data = {"format": NODE_FORMAT, "version": RECORD_VERSION, "run_id": self.run_id, **result.to_dict(),
                "snapshot": info}
        await anyio.to_thread.run_sync(write_json_atomic, self.node_json(result.node), data)
        self.nodes[result.node] = result
        self.snapshot_info[result.node] = info
        self.attempt["ran"].append(result.node)
        logger.debug("run %s: node %s recorded", self.run_id, result.node)

    def partial_result(self, status: str, error: str | None = None, seconds: float = 0.0) -> RunResult:
        """A RunResult from the nodes recorded so far (for cancelled or crashed runs)."""
        hops: list[HopRecord] = []
        for name in self.plan.order:
            if name in self.nodes:
                hops.extend(self.nodes[name].hops)
        outputs = {self.plan.output_key(name): self.nodes[name].effective_text for name in self.plan.outputs
                   if name in self.nodes}
        return RunResult(self.run_id, status, outputs, dict(self.nodes), hops, error=error, seconds=seconds)

    def finish(self, result: RunResult, *, report: bool = True) -> dict[str, Any]:
        """Write the final record.json (and report.html); returns the record."""
        for name, node in result.nodes.items():
            self.nodes.setdefault(name, node)
        try:
            record = self._record(result.status, result, result.error, result.seconds)
            write_json_atomic(self.run_dir / RECORD_FILE, record)
            logger.info("run %s recorded in %s: %s", self.run_id, self.run_dir, result.status)
            if report:
                write_atomic(self.run_dir / REPORT_FILE, render_report(record).encode("utf-8"))
        finally:
            self.close()
        return record

    # the record itself
    def _record(self, status: str, result: RunResult | None, error: str | None, seconds: float) -> dict[str, Any]:
        plan = self.plan
        nodes = dict(self.nodes if result is None else {**self.nodes, **result.nodes})
        ordered = [name for name in plan.order if name in nodes]
        hops: list[HopRecord] = []
        for name in ordered:
            hops.extend(nodes[name].hops)
        outputs = {} if result is None else dict(result.outputs)
        skipped = {} if result is None else dict(result.skipped)
        finished_at = None if status == "running" else time.time()
        attempt = {**self.attempt, "status": status, "finished_at": finished_at, "seconds": seconds}
        return {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "run_id": self.run_id,
            "status": status,
            "error": error,
            "failed_node": None if result is None else result.failed_node,
            "graph": plan.name,
            "topology": {
                "file": self.topology_file,
                "base_dir": None if self.base_dir is None else str(Path(self.base_dir).resolve()),
                "spec": plan.spec.model_dump(mode="json"),
            },
            "plan": {"fingerprint": plan.fingerprint(), "trust_code": plan.trust_code, **self._seal(), **plan.describe()},
            "inputs": plain(dict(plan.inputs)),
            "answers": plan.answers(),
            "outputs": outputs,
            # nodes that did not run, and why; an output node among them is why `outputs` lacks it
            "skipped": {name: skipped[name] for name in plan.order if name in skipped},
            "waiting": [] if result is None else [dict(item) for item in result.waiting],
            # conditional edges' decisions by "source->target" (records before issue 27 keyed them by plan edge id)
            "fired": self._fired(result),
            "seeds": {
                "run": self.seed,
                "nodes": {node.name: node.sampling_seed(self.seed) for node in plan.nodes
                          if node.generate and not node.is_function},
            },
            "models": self._models(),
            "versions": versions(),
            "code": {"fingerprint": code_fingerprint()},
            "timings": {
                "started_at": self.started_at,
                "finished_at": finished_at,
                "seconds": self.earlier_seconds + seconds,
                "nodes": {
                    name: {
                        "started_at": nodes[name].started_at,
                        "finished_at": nodes[name].finished_at,
                        "seconds": max(0.0, nodes[name].finished_at - nodes[name].started_at),
                        "generation_seconds": nodes[name].generation_seconds,
                    }
                    for name in ordered
                },
            },
            "hops": [hop.to_dict() for hop in hops],
            "lineage": {name: nodes[name].lineage.summary() for name in ordered},
            "nodes": {
                name: {
                    **nodes[name].to_dict(),
                    "file": f"{NODES_DIR}/{safe_name(name)}.json",
                    "snapshot": self.snapshot_info.get(name),
                }
                for name in ordered
            },
            "node_status": self._statuses(nodes, skipped, result),
            "unfinished": [name for name in plan.order if name not in nodes and name not in skipped],
            "interrupted": [name for name in plan.order if name in self.started_nodes and name not in nodes],
            "attempts": [*self.attempts, attempt],
        }

    def _statuses(self, nodes: Mapping[str, NodeResult], skipped: Mapping[str, str],
                  result: RunResult | None) -> dict[str, str]:
        """Each plan node's status: finished, skipped, waiting (for a person) or not run."""
        waiting = {item["node"] for item in (result.waiting if result is not None else [])}
        statuses = {}
        for name in self.plan.order:
            if name in waiting:
                statuses[name] = "waiting"
            elif name in nodes:
                statuses[name] = "finished"
            elif name in skipped:
                statuses[name] = "skipped"
            else:
                statuses[name] = "not run"
        return statuses

    def _models(self) -> list[dict[str, Any]]:
        """Each model the plan uses; the fingerprint only where the pool has it loaded (a
        record never loads a model just to describe it)."""
        loaded = {}
        if self.pool is not None:
            loaded = {item.key: item for item in self.pool.loaded()}
        described = []
        for spec in self.plan.models():
            key = model_key(spec, self.base_dir)
            item = loaded.get(key)
            described.append(
                {
                    "name": spec.name,
                    "source": spec.source,
                    "resolved_source": key.source,
                    "dtype": key.dtype,
                    "device": key.device,
                    "backend": key.backend,
                    "fingerprint": None if item is None else item.fingerprint,
                }
            )
        return described
