"""Run directories: what a run read, produced and kept, written so a crash never leaves a torn file.

Layout of `runs/<run_id>/`:

    record.json               the run as a whole (status, inputs, outputs, hops, lineage,
                              versions, seeds, model and plan fingerprints, the topology)
    report.html               a self-contained page of the same (see report.py)
    nodes/<safe>.json         one finished node: NodeResult.to_dict() plus its snapshot's identity
    nodes/<safe>.safetensors  that node's agent state (rclc snapshot: tensors + metadata only)

Every file is written to a temporary name in the same directory, flushed, fsynced and renamed
over its destination (then the directory is fsynced), so a reader sees the old file or the
new one, never half of one. Nothing executable is stored: JSON and safetensors only.

Node files are written as each node finishes, before any node that reads from it starts
(the recording executor saves inside `run_node`), which is what crash-resume relies on. A
node counts as finished on disk only when its JSON exists, its snapshot exists, and the
snapshot's SHA-256 matches the one the JSON names (`finished_nodes`). The snapshot is
written first and the JSON second, so a crash between them leaves a node that is simply
not finished.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import anyio

from ._files import DirectoryLock, file_sha256, write_atomic, write_json_atomic
from .lineage import HopRecord
from .plan import Plan, PlanEdge, PlanNode
from .results import NodeResult, RunResult

RECORD_FORMAT = "rclc-graph-run"
RECORD_VERSION = 1
NODE_FORMAT = "rclc-graph-node"
RECORD_FILE = "record.json"
REPORT_FILE = "report.html"
NODES_DIR = "nodes"
_PLAN_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)(?:\[([0-9]+)\])?(?:@([0-9]+))?$")


# -- small pieces ------------------------------------------------------------------------------


def safe_name(node: str) -> str:
    """A file-name stem for a plan node name, injective and free of shell-special characters.

    `reader` -> `reader`, `worker[2]` -> `worker.2`, `a@3` -> `a.r3`, `worker[2]@3` ->
    `worker.2.r3`. Declared names never contain '.', so the encoded parts cannot collide
    with a plain name. Anything else (not a plan name) is hex-encoded after `.x`.
    """
    match = _PLAN_NAME.match(node)
    if match is None:
        return ".x" + node.encode("utf-8").hex()
    base, index, round_ = match.groups()
    return base + ("" if index is None else f".{index}") + ("" if round_ is None else f".r{round_}")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions that decide what a run computes (read from package metadata, no imports)."""
    import rclc

    return {
        "rclc": rclc.__version__,
        "rclc_graph": _version("rclc-graph"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 of the source of rclc and rclc_graph (every .py file but the experiments tool).

    Package versions do not move when code is edited in place (a checkout, a patch), yet
    any edit may change what a node computes; a resume compares this to refuse finishing a
    run with different code than started it.
    """
    import rclc

    digest = hashlib.sha256()
    for package in (Path(rclc.__file__).parent, Path(__file__).parent):
        for path in sorted(package.rglob("*.py")):
            relative = path.relative_to(package.parent).as_posix()
            if "/experiments/" in relative or "__pycache__" in relative:
                continue
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def node_seed(plan_node: PlanNode, run_seed: int) -> int | None:
    """The sampling seed a generating node uses: its agent's seed, else one derived from the run's."""
    if not plan_node.generate:
        return None
    if plan_node.agent.seed is not None:
        return plan_node.agent.seed
    digest = hashlib.sha256(f"{run_seed}:{plan_node.name}".encode()).digest()  # as runtime._node_seed
    return int.from_bytes(digest[:4], "big")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


# -- the recorder ------------------------------------------------------------------------------


class RunRecorder:
    """Writes one run's directory while it runs; `finish` writes record.json and report.html.

    Use `wrap(executor)` as the scheduler's executor: after each node it saves the node's
    result and agent snapshot, then lets the scheduler continue. `record.json` is written
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
        pool: Any = None,
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
        self.lock: DirectoryLock | None = None
        self._created = False

    # where things go
    def node_json(self, node: str) -> Path:
        return self.run_dir / NODES_DIR / f"{safe_name(node)}.json"

    def node_snapshot(self, node: str) -> Path:
        return self.run_dir / NODES_DIR / f"{safe_name(node)}.safetensors"

    def start(self) -> Path:
        """Create the run directory (refusing an existing one) and write a 'running' record."""
        try:
            (self.run_dir / NODES_DIR).mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise ValueError(
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
        self.earlier_seconds = sum(float(attempt.get("seconds") or 0.0) for attempt in earlier)
        self.attempt = {"started_at": time.time(), "ran": [], "reused": sorted(finished, key=self._order),
                        "restored": sorted(restored, key=self._order)}
        write_json_atomic(self.run_dir / RECORD_FILE, self._record("running", None, None, 0.0))
        return self.run_dir

    def _order(self, name: str) -> int:
        try:
            return self.plan.order.index(name)
        except ValueError:
            return len(self.plan.order)

    def close(self) -> None:
        """Release the directory lock (finish() does it too)."""
        if self.lock is not None:
            self.lock.release()

    def wrap(self, executor: Any) -> RecordingExecutor:
        return RecordingExecutor(executor, self)

    async def save_node(self, result: NodeResult, agent: Any | None) -> None:
        """Snapshot first, JSON second (naming the snapshot's SHA-256): the JSON's presence
        with a matching snapshot is what 'finished on disk' means."""
        info: dict[str, Any] | None = None
        if agent is not None and self.snapshots:
            path = self.node_snapshot(result.node)
            await agent.save(path)
            info = await anyio.to_thread.run_sync(_snapshot_identity, path)
        data = {"format": NODE_FORMAT, "version": RECORD_VERSION, "run_id": self.run_id, **result.to_dict(),
                "snapshot": info}
        await anyio.to_thread.run_sync(write_json_atomic, self.node_json(result.node), data)
        self.nodes[result.node] = result
        self.snapshot_info[result.node] = info
        self.attempt["ran"].append(result.node)

    def partial_result(self, status: str, error: str | None = None, seconds: float = 0.0) -> RunResult:
        """A RunResult from the nodes recorded so far (for cancelled or crashed runs)."""
        hops: list[HopRecord] = []
        for name in self.plan.order:
            if name in self.nodes:
                hops.extend(self.nodes[name].hops)
        outputs = {name: self.nodes[name].text or "" for name in self.plan.outputs if name in self.nodes}
        return RunResult(self.run_id, status, outputs, dict(self.nodes), hops, error=error, seconds=seconds)

    def finish(self, result: RunResult, *, report: bool = True) -> dict[str, Any]:
        """Write the final record.json (and report.html); returns the record."""
        for name, node in result.nodes.items():
            self.nodes.setdefault(name, node)
        try:
            record = self._record(result.status, result, result.error, result.seconds)
            write_json_atomic(self.run_dir / RECORD_FILE, record)
            if report:
                from .report import render_report

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
            "plan": {"fingerprint": plan.fingerprint(), "trust_code": plan.trust_code, **plan.describe()},
            "inputs": _plain(dict(plan.inputs)),
            "outputs": outputs,
            "seeds": {
                "run": self.seed,
                "nodes": {node.name: node_seed(node, self.seed) for node in plan.nodes if node.generate},
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
            "unfinished": [name for name in plan.order if name not in nodes],
            "interrupted": [name for name in plan.order if name in self.started_nodes and name not in nodes],
            "attempts": [*self.attempts, attempt],
        }

    def _models(self) -> list[dict[str, Any]]:
        """Each model the plan uses; the fingerprint only where the pool has it loaded (a
        record never loads a model just to describe it)."""
        from .pool import model_key

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


def _snapshot_identity(path: Path) -> dict[str, Any]:
    """What a node JSON says about its snapshot: file name, SHA-256, size and the model
    identity stored in the snapshot's own header."""
    import safetensors

    with safetensors.safe_open(os.fspath(path), framework="pt") as reader:
        header = json.loads((reader.metadata() or {}).get("rclc", "{}"))
        positions = int(reader.get_slice("rows").get_shape()[0])
    return {
        "file": path.name,
        "sha256": file_sha256(path),
        "bytes": path.stat().st_size,
        "positions": positions,
        "model_identity": header.get("identity"),
    }


class RecordingExecutor:
    """Wraps an executor: every node's result and snapshot reach disk before the scheduler
    sees it finished, so nodes downstream never start before their senders are recorded.

    (The scheduler's observer hook is synchronous; saving a snapshot is not, so recording
    happens here.) Executors without `agent(run_id, node)` are recorded without snapshots.
    """

    def __init__(self, inner: Any, recorder: RunRecorder) -> None:
        self.inner = inner
        self.recorder = recorder
        self.name = getattr(inner, "name", "recorded")

    async def run_node(self, ctx: Any, node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]]) -> NodeResult:
        self.recorder.started_nodes.add(node.name)
        result = await self.inner.run_node(ctx, node, inbound)
        agent = None
        if hasattr(self.inner, "agent"):
            agent = self.inner.agent(ctx.run_id, node.name)
        await self.recorder.save_node(result, agent)
        return result

    def release(self, run_id: str) -> None:
        self.inner.release(run_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # agent(), adopt(), pool, ... of the wrapped executor


# -- running with a record ---------------------------------------------------------------------


async def run_recorded(
    plan: Plan,
    out: str | os.PathLike[str] = "runs",
    *,
    seed: int = 0,
    pool: Any = None,
    executor: Any = None,
    events: Any = None,
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
    from .pool import default_pool
    from .runtime import LocalExecutor
    from .scheduler import new_run_id

    pool = pool if pool is not None else default_pool()
    owned = None
    if isinstance(executor, str):  # a name: make it here and close it when the run ends
        from .executors import make_executor

        executor = owned = make_executor(executor, pool=pool)
    try:
        if executor is None or isinstance(owned, LocalExecutor):
            await prepare_models(plan, pool, base_dir)
        recorder = RunRecorder(out, plan, run_id=run_id or new_run_id(), seed=seed, topology_file=topology_file,
                               pool=pool, base_dir=base_dir)
        recorder.start()
        inner = executor if executor is not None else LocalExecutor(pool)
        return await record_run(recorder, inner, pool=pool, events=events, base_dir=base_dir)
    finally:
        if owned is not None:
            owned.close()


async def prepare_models(plan: Plan, pool: Any, base_dir: Path | None) -> None:
    """Check every prompt fits its context (tokenizers only) and every trusted module:callable
    imports, then load the plan's models."""
    from .preflight import check_code, check_context

    await anyio.to_thread.run_sync(check_code, plan)
    await anyio.to_thread.run_sync(check_context, plan, pool, base_dir)
    for spec in plan.models():
        await anyio.to_thread.run_sync(pool.get, spec, base_dir)


async def record_run(
    recorder: RunRecorder,
    executor: Any,
    *,
    pool: Any,
    events: Any = None,
    base_dir: Path | None = None,
    completed: dict[str, NodeResult] | None = None,
) -> tuple[RunResult, dict[str, Any], Path]:
    """Run the recorder's plan through `executor`, recording every node, and finish the record
    (also when the run is cancelled or crashes, before that propagates)."""
    from .scheduler import run_plan

    began = time.perf_counter()
    try:
        result = await run_plan(recorder.plan, pool=pool, executor=recorder.wrap(executor), events=events,
                                run_id=recorder.run_id, seed=recorder.seed, base_dir=base_dir, completed=completed)
    except BaseException as error:
        stopped = isinstance(error, (KeyboardInterrupt, anyio.get_cancelled_exc_class())) or _only_cancelled(error)
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
    """`run_recorded` for code without an event loop."""
    import functools

    return anyio.run(functools.partial(run_recorded, plan, out, **options))


def _only_cancelled(error: BaseException) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return all(_only_cancelled(inner) for inner in error.exceptions)
    return isinstance(error, anyio.get_cancelled_exc_class())


# -- reading -----------------------------------------------------------------------------------


def read_record(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The record of a run directory, checked to be one (ValueError naming the fix otherwise)."""
    directory = Path(run_dir)
    path = directory / RECORD_FILE
    if not directory.is_dir():
        raise ValueError(f"run_dir: {str(directory)!r} is not a directory; pass a runs/<run_id> directory")
    if not path.is_file():
        raise ValueError(
            f"run_dir: {str(directory)!r} holds no {RECORD_FILE}; pass a directory written by `rclc-graph run`"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"run_dir: {str(path)!r} is not valid JSON ({error}); the record is damaged") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"run_dir: {str(path)!r} is not an rclc-graph run record")
    if record.get("version") != RECORD_VERSION:
        raise ValueError(
            f"run_dir: record version {record.get('version')!r}; this rclc-graph reads version {RECORD_VERSION} only"
        )
    return record


def read_node(path: str | os.PathLike[str]) -> tuple[NodeResult, dict[str, Any] | None]:
    """A node file: (its NodeResult, its snapshot info or None)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != NODE_FORMAT:
        raise ValueError(f"path: {os.fspath(path)!r} is not an rclc-graph node record")
    if data.get("version") != RECORD_VERSION:
        raise ValueError(f"path: node record version {data.get('version')!r}; expected {RECORD_VERSION}")
    return NodeResult.from_dict(data), data.get("snapshot")


def finished_nodes(run_dir: str | os.PathLike[str]) -> dict[str, NodeResult]:
    """Nodes finished on disk: node JSON present, snapshot present, and the snapshot's
    SHA-256 equal to the one the JSON names. Anything else (missing, torn by a crash,
    replaced) is left out, so a resume runs that node again."""
    directory = Path(run_dir) / NODES_DIR
    finished: dict[str, NodeResult] = {}
    if not directory.is_dir():
        return finished
    for path in sorted(directory.glob("*.json")):
        try:
            result, snapshot = read_node(path)
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if path.stem != safe_name(result.node) or not isinstance(snapshot, dict):
            continue
        snapshot_path = directory / str(snapshot.get("file", ""))
        if snapshot_path.name != f"{path.stem}.safetensors" or not snapshot_path.is_file():
            continue
        if file_sha256(snapshot_path) != snapshot.get("sha256"):
            continue
        finished[result.node] = result
    return finished
