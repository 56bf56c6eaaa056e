"""Continue an interrupted run from its directory: finished nodes are kept, the rest runs.

A run directory holds what a resume needs (record/format.py): the topology as JSON, the inputs,
trust_code and the seed in record.json, and per finished node its result and a snapshot of
its agent's state. Resuming rebuilds the plan from the record, restores the agents whose
state an unfinished node will read, and hands the scheduler the finished results as
`completed`, so no finished node runs again and fan-in nodes whose senders finished
before the crash receive exactly what they would have received. Outputs equal those of
an uninterrupted run under greedy decoding: a restored agent re-prefills its rows, and
the runtime re-prefills every generating sender too (`Agent.refresh`), so selectors read
the same cache either way.

Everything that could make the continuation differ is refused, before anything in the
directory is written (`ResumeError`, a ValueError naming the file or field and the fix):
a record whose plan no longer compiles to the recorded fingerprint, different rclc /
rclc-graph source, torch or transformers versions, a different model (weights,
configuration or vocabulary), node files that are damaged, edited or from another run,
snapshots that fail their own checks (truncated, edited, another model or layout), and a
trust_code run resumed without trust_code, unless its record carries this user's seal
(record/trust_seal.py: started with trust_code here, its code references unchanged). The
directory is locked for the whole resume, so a run still going (or a second resume) cannot
write the same nodes.

A run that waits for a person (status "waiting") is resumed with their answers
(`answers={node: text}`, `--answer NODE=TEXT`): they join the answers the run already had
(kept in record.json; a finished node's answer cannot change) and the run continues. A
waiting run resumed without an answer for any node it waits for is refused, naming them.
Function nodes handed over as Python callables (`Graph.function`) are found again through
`functions={call reference: callable}`, else imported from their reference (trust_code).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import anyio

import rclc
from rclc.files import file_sha256

from ..errors import GraphError, ResumeError
from ..executors import Executor, ModelPool, RunContext
from ..executors.trusted_code import import_callable, search_beside
from ..plan.compile import compile_plan
from ..plan.dag import Plan
from ..results.events import EventStream
from ..results.run_result import NodeResult, RunResult
from ..spec.models import GraphSpec
from .directory_lock import DirectoryLock
from .record.format import NODES_DIR, code_fingerprint, safe_name, snapshot_identity, versions
from .record.reader import read_node, read_record
from .record.recording import record_run
from .settings import RunSettings, prepare_run
from .record.shape import check_record
from .record.trust_seal import sealed
from .record.writer import RunRecorder
from .run_files import check_tree, member, read_json, regular
from .scheduler import refuse_event_stream

logger = logging.getLogger(__name__)

# Versions that decide what a node computes; the code fingerprint covers rclc's own source.
_COMPUTING_PACKAGES = ("rclc", "rclc_graph", "torch", "transformers")


@dataclass(frozen=True)
class ResumePoint:
    """What a run directory says about where to continue (read without any model work)."""

    run_dir: Path
    record: Mapping[str, Any]
    plan: Plan
    seed: int
    base_dir: Path | None
    finished: Mapping[str, NodeResult]  # nodes finished on disk, verified
    snapshots: Mapping[str, Mapping[str, Any]]  # their snapshot identity (file, sha256, model_identity)
    restore: tuple[str, ...]  # finished nodes whose state an unfinished receiver reads, plan order

    @property
    def run_id(self) -> str:
        """The run being resumed."""
        return str(self.record["run_id"])

    @property
    def remaining(self) -> tuple[str, ...]:
        """Nodes still to run, in plan order."""
        return tuple(name for name in self.plan.order if name not in self.finished)


def _field(record: Mapping[str, Any], *path: str) -> Any:
    value: Any = record
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            raise ResumeError(
                f"run_dir: record.json has no {'.'.join(path)}; it was not written by a resumable rclc-graph run"
            )
        value = value[part]
    return value


def _answers(record: Mapping[str, Any], given: Mapping[str, str] | None, finished: set[str]) -> dict[str, str]:
    """The answers the run had, joined by the ones given now (a finished node keeps its own)."""
    recorded = record.get("answers") or {}
    if not isinstance(recorded, Mapping):
        raise ResumeError("run_dir: record.json answers is not a mapping; the record was edited")
    joined = dict(recorded)
    for name, answer in dict(given or {}).items():
        if name in recorded and recorded[name] != answer and name in finished:
            raise ResumeError(
                f"answers: node {name!r} already ran with the answer {recorded[name]!r}; a finished node keeps its "
                "answer (start a new run to answer it otherwise)"
            )
        joined[name] = answer
    return joined


def _check_waiting(record: Mapping[str, Any], plan: Plan) -> None:
    """A waiting run continues only once at least one node it waits for has an answer."""
    if record.get("status") != "waiting":
        return
    waiting = [item.get("node") for item in record.get("waiting") or [] if isinstance(item, Mapping)]
    answered = plan.answers()
    if waiting and not any(name in answered for name in waiting):
        asked = "; ".join(f"{item.get('node')}: {item.get('question')}" for item in record.get("waiting") or []
                          if isinstance(item, Mapping))
        first = waiting[0]
        raise ResumeError(
            f"answers: the run waits for an answer ({asked}); pass --answer {first}=TEXT to rclc-graph resume, or "
            f"answers={{{first!r}: ...}} to resume_run, astream_resume or stream_resume"
        )


def _rebuild_plan(
    record: Mapping[str, Any],
    trust_code: bool,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> Plan:
    recorded_trust = _field(record, "plan", "trust_code")
    if recorded_trust is True and not trust_code and not sealed(record):
        raise ResumeError(
            "trust_code: this run imports code named by its topology (trust_code was on when it started), and its "
            "record does not carry this user's seal (it was started elsewhere, by another user, or edited); pass "
            "--trust-code (trust_code=True) to resume it, if you trust that code"
        )
    if recorded_trust is True or trust_code:  # modules beside the topology file import without PYTHONPATH
        search_beside(_recorded_base_dir(record))
    try:
        spec = GraphSpec.model_validate(_field(record, "topology", "spec"))
        functions = _functions(spec, functions, trust_code and not recorded_trust)
        # the inputs were accepted when the run started (and the fingerprint below pins them): no size limit
        plan = compile_plan(
            spec,
            _field(record, "inputs"),
            trust_code=bool(recorded_trust),
            max_input_bytes=None,
            answers=answers,
            functions=functions,
        )
    except GraphError as error:
        if all(problem.path[:1] == ("answers",) for problem in error.problems):
            raise ResumeError(f"answers: {error}") from None
        if all(problem.code == "E_TRUST_CODE" and problem.path[-1:] == ("call",) for problem in error.problems):
            topologies = dict(spec.topologies())  # a function node may sit inside a subgraph
            names = ", ".join(sorted({str(topologies[tuple(problem.path[:-3])].nodes[int(problem.path[-2])].call)
                                      for problem in error.problems}))
            raise ResumeError(
                f"functions: this run's function nodes ({names}) were handed over as Python callables; pass "
                "functions=graph.functions to resume_run, astream_resume or stream_resume, or trust_code=True "
                "(--trust-code) to import them by name"
            ) from None
        raise ResumeError(f"run_dir: the recorded topology and inputs no longer plan: {error}") from None
    recorded = _field(record, "plan", "fingerprint")
    if plan.fingerprint() != recorded:
        raise ResumeError(
            f"run_dir: the plan rebuilt from record.json has fingerprint {plan.fingerprint()[:12]}, the run recorded "
            f"{str(recorded)[:12]}; the record was edited or this rclc-graph plans differently; start a new run"
        )
    return plan


def _recorded_base_dir(record: Mapping[str, Any]) -> Path | None:
    """The directory the run's topology file was in (profiles and modules resolve there)."""
    recorded_base = (record.get("topology") or {}).get("base_dir")
    return Path(recorded_base) if isinstance(recorded_base, str) else None


def _functions(
    spec: GraphSpec, given: Mapping[str, Callable[..., Any]] | None, importing: bool
) -> dict[str, Callable[..., Any]]:
    """The callables of function nodes for a run that was handed them in Python (it recorded
    trust_code off): those given, and with the caller's trust_code the others imported from
    their references (the plan, and so its fingerprint, stays the one recorded)."""
    functions = dict(given or {})
    if importing:
        nodes = [node for _, topology in spec.topologies() for node in topology.nodes]  # subgraphs' too
        for node in nodes:
            if node.call is not None and node.call not in functions:
                try:
                    functions[node.call] = import_callable(node.call, trust_code=True, field_name=f"nodes.{node.name}.call")
                except Exception as error:  # an import runs the module's code, which may raise anything
                    raise ResumeError(
                        f"functions: function node {node.name!r} names {node.call!r}, which cannot be imported "
                        f"({type(error).__name__}: {error}); pass functions={{{node.call!r}: ...}}"
                    ) from None
    return functions


def _check_code(record: Mapping[str, Any]) -> None:
    recorded = _field(record, "versions")
    current = versions()
    changed = [
        f"{name} {recorded.get(name)} -> {current.get(name)}"
        for name in _COMPUTING_PACKAGES
        if recorded.get(name) != current.get(name)
    ]
    if changed:
        raise ResumeError(
            f"versions: the run started with other software ({', '.join(changed)}); resuming could give other "
            "outputs than an uninterrupted run; start a new run, or resume with the versions it started with"
        )
    code = record.get("code")
    if isinstance(code, Mapping) and code.get("fingerprint") != code_fingerprint():
        raise ResumeError(
            "code: the rclc / rclc-graph source changed since the run started (code fingerprint "
            f"{str(code.get('fingerprint'))[:12]} -> {code_fingerprint()[:12]}); resuming could give other outputs "
            "than an uninterrupted run; start a new run"
        )


def _finished_on_disk(run_dir: Path, plan: Plan, run_id: str) -> tuple[dict[str, NodeResult], dict[str, dict[str, Any]]]:
    """Verified finished nodes. A node file is written after its snapshot, so a crash leaves
    at most a snapshot without a node file (ignored: the node runs again). A node file whose
    snapshot is missing, does not hash to what it names, or does not describe the node's
    state (positions, inherited rows, lineage) was damaged, edited or swapped:
    refused. Every path stays inside the directory and no link is followed (run_files.py)."""
    directory = run_dir / NODES_DIR
    finished: dict[str, NodeResult] = {}
    snapshots: dict[str, dict[str, Any]] = {}
    try:
        check_tree(run_dir, NODES_DIR)
    except ValueError as error:
        raise ResumeError(str(error)) from None
    if not directory.is_dir():
        return finished, snapshots
    known = set(plan.order)
    for path in sorted(directory.glob("*.json")):
        where = f"{NODES_DIR}/{path.name}"
        try:
            result, snapshot = read_node(path)
            stored_run = _node_run_id(path)
        except (ValueError, KeyError, TypeError, OSError) as error:
            raise ResumeError(f"run_dir: {where} is damaged ({error}); delete it to run that node again") from None
        if stored_run != run_id:
            raise ResumeError(f"run_dir: {where} belongs to run {stored_run!r}, not {run_id!r}; remove it")
        if result.node not in known or path.stem != safe_name(result.node):
            raise ResumeError(f"run_dir: {where} holds node {result.node!r}, which is not this file's node of the plan; "
                              "remove it")
        if snapshot is None and plan.node(result.node).is_function:
            finished[result.node] = result  # a function keeps no state: its result is all there is
            continue
        if not isinstance(snapshot, dict):
            if plan.node(result.node).model.is_api:  # text is all an API node leaves: it is finished
                finished[result.node] = result
            continue  # else recorded without a snapshot (an executor without agents): not resumable state
        fix = f"delete {where} to run node {result.node!r} again"
        try:
            snapshot_path = member(directory, snapshot.get("file"), f"{path.stem}.safetensors")
            regular(snapshot_path, "snapshot")
        except FileNotFoundError:
            raise ResumeError(f"run_dir: the snapshot {where} names is missing; {fix}") from None
        except (ValueError, OSError) as error:
            raise ResumeError(f"run_dir: {where} {error}; {fix}") from None
        if file_sha256(snapshot_path) != snapshot.get("sha256"):
            raise ResumeError(
                f"run_dir: {NODES_DIR}/{snapshot_path.name} does not match the SHA-256 {where} names (edited, "
                f"truncated or replaced); {fix}"
            )
        _check_snapshot_describes(snapshot_path, snapshot, result, where, fix)
        finished[result.node] = result
        snapshots[result.node] = snapshot
    return finished, snapshots


def _check_snapshot_describes(path: Path, snapshot: Mapping[str, Any], result: NodeResult, where: str, fix: str) -> None:
    """The snapshot must be this node's state: its row count and inherited rows agree with
    what the node file records, and the node's lineage covers every row.
    (A snapshot swapped in from another node, with its SHA-256 rewritten, fails here.)"""
    try:
        header = snapshot_identity(path)
    except Exception as error:  # safetensors raises its own error types for a damaged file
        raise ResumeError(
            f"run_dir: node {result.node!r}: its snapshot {NODES_DIR}/{path.name} cannot be restored: not a readable "
            f"snapshot ({error}); {fix}"
        ) from None
    # (the model identity is checked against the loaded model by _check_models and by the load itself)
    checks = (
        ("positions", header["positions"], snapshot.get("positions")),
        ("positions", header["positions"], result.positions),
        ("positions", header["positions"], len(result.lineage)),
        ("inherited positions", header["inherited_positions"], result.inherited_positions),
    )
    for what, found, recorded in checks:
        if found != recorded:
            raise ResumeError(
                f"run_dir: {NODES_DIR}/{path.name} holds {what} {found!r} but {where} records {recorded!r}: the "
                f"snapshot is not this node's state (swapped or edited); {fix}"
            )


def _ran(run_dir: Path) -> set[str]:
    """Nodes that wrote a node file (they ran, whatever else a resume will check about them)."""
    names = set()
    for path in (run_dir / NODES_DIR).glob("*.json"):
        try:
            names.add(read_node(path)[0].node)
        except (ValueError, KeyError, TypeError, OSError):
            continue  # a damaged file: _finished_on_disk refuses it with the fix
    return names


def _node_run_id(path: Path) -> Any:
    data = read_json(path, "path")
    return data.get("run_id") if isinstance(data, dict) else None


def read_resume_point(
    run_dir: str | os.PathLike[str],
    *,
    trust_code: bool = False,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> ResumePoint:
    """Read and check a run directory for resuming (with `answers` for nodes that wait for a
    person, and `functions` for function nodes built from Python callables); loads no model
    and writes nothing."""
    directory = Path(run_dir)
    try:
        record = read_record(directory)
        check_record(record)
    except ValueError as error:
        raise ResumeError(str(error)) from None
    run_id = str(_field(record, "run_id"))
    plan = _rebuild_plan(record, trust_code, _answers(record, answers, _ran(directory)), functions)
    _check_waiting(record, plan)
    _check_code(record)
    seed = _field(record, "seeds", "run")
    if type(seed) is not int:
        raise ResumeError(f"run_dir: record.json seeds.run is {seed!r}; expected the run's integer seed")
    base_dir = _recorded_base_dir(record)
    finished, snapshots = _finished_on_disk(directory, plan, run_id)
    restore = tuple(
        name
        for name in plan.order
        if name in finished
        and any(edge.policy.mode != "text" and edge.target not in finished for edge in plan.outgoing(name))
    )
    return ResumePoint(directory, record, plan, seed, base_dir, finished, snapshots, restore)


async def resume_run(
    run_dir: str | os.PathLike[str],
    *,
    pool: ModelPool | None = None,
    executor: Executor | None = None,
    events: EventStream | None = None,
    trust_code: bool = False,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> tuple[RunResult, dict[str, Any], Path]:
    """Continue the run recorded in `run_dir`; returns (result, record, run_dir) like run_recorded.

    `answers` ({node: text}) answer the nodes a waiting run waits for; `functions` are the
    callables of function nodes built in Python (`Graph.function`), by `call` reference.

    Refusals (ResumeError) leave the directory exactly as it was. The resumed attempt is
    recorded in the same directory: its nodes next to the old ones, and the record's
    `attempts` say which nodes each attempt ran, reused and restored.
    """
    directory = Path(run_dir)
    if not directory.is_dir():
        raise ResumeError(f"run_dir: {str(directory)!r} is not a directory; pass a runs/<run_id> directory")
    lock = DirectoryLock(directory)
    lock.acquire()  # before reading: nothing may change between the checks and the run
    settings: RunSettings | None = None
    try:
        point = read_resume_point(directory, trust_code=trust_code, answers=answers, functions=functions)
        settings = RunSettings.build(pool=pool, executor=executor, base_dir=point.base_dir)
        if settings.loads_models_here:
            await prepare_run(point.plan, settings)
        await anyio.to_thread.run_sync(_check_models, point, settings)  # hashing weights takes a moment
        agents = {name: await _restore(settings, point, name) for name in point.restore}
        recorder = RunRecorder(directory.parent, point.plan, run_id=point.run_id, seed=point.seed,
                               topology_file=(point.record.get("topology") or {}).get("file"), pool=settings.pool,
                               base_dir=point.base_dir)
        recorder.run_dir = directory  # the directory may have been moved or renamed since
        recorder.resume(point.record, point.finished, point.snapshots, restored=list(agents), lock=lock)
    except BaseException:
        lock.release()
        if settings is not None:
            settings.close()
        raise
    try:
        for name, agent in agents.items():
            settings.executor.adopt(point.run_id, name, agent)
        logger.info("resuming run %s: %d of %d nodes finished before, %d restored", point.run_id, len(point.finished),
                    len(point.plan.nodes), len(agents))
        return await record_run(recorder, settings, events=events, completed=dict(point.finished))
    finally:
        settings.close()  # only an executor made here (from a name, or the default local one)


def resume_run_sync(run_dir: str | os.PathLike[str], **options: Any) -> tuple[RunResult, dict[str, Any], Path]:
    """`resume_run` from synchronous code; inside a running event loop (a Jupyter cell) the
    run gets a loop of its own in a worker thread (`rclc.call_sync`)."""
    refuse_event_stream("resume_run_sync", options)
    return rclc.call_sync(resume_run, run_dir, **options)


async def _silent(kind: str, payload: dict[str, Any]) -> None:
    return None


def _check_models(point: ResumePoint, settings: RunSettings) -> None:
    """The loaded models must be the ones the run used: the record's fingerprints, and the
    identity each finished node's snapshot was written with."""
    recorded = {item.get("name"): item for item in point.record.get("models") or [] if isinstance(item, Mapping)}
    current: dict[str, str] = {}
    for spec in point.plan.models():
        loaded = settings.pool.get(spec, settings.base_dir)
        fingerprint = loaded.fingerprint
        current[spec.name] = fingerprint
        expected = (recorded.get(spec.name) or {}).get("fingerprint")
        if expected is not None and expected != fingerprint:
            raise ResumeError(
                f"models: model {spec.name!r} ({spec.source}) is not the one the run used (fingerprint "
                f"{str(expected)[:12]} -> {fingerprint[:12]}: other weights, configuration or vocabulary); "
                "restore the original checkpoint, or start a new run"
            )
    for name, snapshot in point.snapshots.items():
        identity = snapshot.get("model_identity")
        model = point.plan.node(name).model.name
        if identity is not None and identity != current[model]:
            raise ResumeError(
                f"run_dir: {NODES_DIR}/{snapshot.get('file')} was written with another model than {model!r}; "
                "restore the original checkpoint, or start a new run"
            )


async def _restore(settings: RunSettings, point: ResumePoint, name: str) -> Any:
    """Bind the node's agent as the run did and load its snapshot (every check before use)."""
    executor = settings.executor
    ctx = RunContext(run_id=point.run_id, plan=point.plan, publish=_silent, seed=point.seed, base_dir=settings.base_dir)
    try:
        agent = executor.bind(ctx, point.plan.node(name))
    except NotImplementedError as error:
        raise ResumeError(f"executor: {executor.name!r} cannot adopt restored agents ({error})") from None
    path = point.run_dir / NODES_DIR / str(point.snapshots[name]["file"])
    try:
        await agent.load(path)
    except (ValueError, OSError) as error:
        raise ResumeError(f"run_dir: node {name!r}: its snapshot {NODES_DIR}/{path.name} cannot be restored: {error}") from None
    return agent


__all__ = ["ResumePoint", "read_resume_point", "resume_run", "resume_run_sync"]
