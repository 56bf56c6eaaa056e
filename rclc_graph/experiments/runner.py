"""The experiment loop: one topology, one dataset, several arms -> results, summary, report.

    run_experiment(topology, data, arms, out_dir)

1. Loads the topology and the dataset, resolves how cases map onto the topology's inputs,
   applies and validates every arm and plans every (case, arm): any problem (a bad arm, a
   case with the wrong number of documents, a user selector without trust_code) is reported
   before a single model runs.
2. Runs cases x arms, arms inner, so an interrupted experiment holds complete comparisons
   for its first cases. Each run goes through the injected `run_case` (default: the
   scheduler) and becomes one fsynced row of DIR/results.jsonl. With `concurrency=N`, N
   runs are in flight at once (their generations share each model's batches, see
   rclc.Batching), and rows are still written in that order (see `_in_order`), so the
   file, the progress reports and the summary equal a sequential run's.
3. Resumes: rows already in the file for the same (case, arm) are not recomputed. A row
   computed for a different graph or a changed case is refused (new --out, or rename the
   arm), never silently mixed in.
4. Writes DIR/summary.json, the two plots and DIR/report.md from the rows of this run's
   cases and arms.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from rclc.files import file_sha256, write_json_atomic

from ..errors import GraphError, PlanError, Problem, UsageError
from ..executors.trusted_code import search_beside
from ..plan.compile import expand
from ..spec.load import read_graph
from .arm_graphs import apply_arm, spec_fingerprint, validate_arms
from .arms import Arm, parse_arm
from .case_result import CaseResult, RunCase, failed_result, hop_totals, scheduler_run_case
from .datasets import Case, read_dataset
from .figures import write_report
from .inputs import check_case_fits, resolve_mapping
from .scoring import Scorer, load_scorer
from .store import ResultStore
from .summary import summarise

SUMMARY = "summary.json"
MAX_REPORTED = 20


@dataclass(frozen=True)
class Progress:
    """Reported after every (case, arm): `done` of `total`, and whether it was resumed."""

    done: int
    total: int
    case: str
    arm: str
    resumed: bool
    row: Mapping[str, Any]


@dataclass(frozen=True)
class Summary:
    """What `run_experiment` produced: summary.json's content and the files written."""

    directory: Path
    data: Mapping[str, Any]
    files: Mapping[str, Path] = field(default_factory=dict)
    computed: int = 0  # rows computed by this call
    resumed: int = 0  # rows found in results.jsonl and not recomputed
    recovered_bytes: int = 0  # a torn last row dropped on opening the store

    @property
    def arms(self) -> Mapping[str, Any]:
        return self.data["arms"]


def run_experiment(  # the public API (docs/experiments.md): one keyword per `rclc-graph experiment` option
    topology_path: str | os.PathLike[str],
    dataset_path: str | os.PathLike[str],
    arms: Sequence[Arm | str],
    out_dir: str | os.PathLike[str],
    *,
    limit: int | None = None,
    run_case: RunCase | None = None,
    progress: Callable[[Progress], None] | None = None,
    trust_code: bool = False,
    scorer: str | None = None,
    seed: int = 0,
    input_map: Mapping[str, str] | None = None,
    retry_failed: bool = False,
    compare_to: str | None = None,
    concurrency: int = 1,
    max_batch: int | None = None,
) -> Summary:
    """Run (or resume) an experiment and write its summary, plots and report into `out_dir`.

    `run_case(spec, inputs, case) -> CaseResult` runs one arm's graph on one case; the
    default plans it and runs the scheduler with `seed`. An exception from `run_case` is
    recorded as a failed row (counted as wrong), except ImportError, which stops the
    experiment; `retry_failed` recomputes failed rows, which are otherwise kept. `compare_to`
    names the arm the table tests every other arm against (default: the first). ValueError
    (GraphError, StoreError) for any problem found before the runs start.

    A row is marked `warmup` when its run loaded a model (with `concurrency` > 1: when a
    model loaded while it was in flight) or was the first this call computed; latency
    medians leave warm-up rows out (summary.py).

    `concurrency` runs that many (case, arm) runs at once (each in its own thread; a custom
    `run_case` must then be thread-safe); rows, progress and summary come in the same order
    as with 1. `max_batch` caps how many sequences a model decodes together (default
    scheduler only; None: the topology's `batching`, else rclc's default).
    """
    arm_list = _checked_arms(arms, compare_to, concurrency)
    if trust_code:  # modules beside the topology file import without PYTHONPATH (executors/trusted_code.py)
        search_beside(Path(topology_path).resolve().parent)
    score = load_scorer(scorer, trust_code=trust_code)
    loaded = read_graph(topology_path, trusted=trust_code)
    spec = loaded.spec
    cases = read_dataset(dataset_path, limit=limit)
    mapping = resolve_mapping(spec, input_map)
    blueprints = validate_arms(spec, arm_list, mapping=mapping, trust_code=trust_code)
    arm_specs = {arm.name: apply_arm(spec, arm, mapping=mapping) for arm in arm_list}
    _check_cases(spec, arm_list, blueprints, mapping, cases)
    if run_case is None:
        try:
            run_case = scheduler_run_case(trust_code=trust_code, seed=seed, max_batch=max_batch)
        except ImportError as exc:
            raise RuntimeError(f"the graph scheduler is not available ({exc}); experiments need rclc_graph.run") from exc
    loop = _Loop(cases, arm_list, arm_specs, {name: spec_fingerprint(arm_spec) for name, arm_spec in arm_specs.items()},
                 mapping, run_case, score, seed, concurrency, progress)
    directory = Path(out_dir)
    with ResultStore(directory) as store:
        computed, resumed = loop.run(store, retry_failed=retry_failed)
        answers = {case.id: case.answers for case in cases}
        rows = [_rescored(row, score, answers) for row in store.rows()]
        recovered = store.recovered_bytes
    keys = {(case.id, arm.name) for case in cases for arm in arm_list}
    metadata = _metadata(
        loaded.spec, topology_path, dataset_path, cases, limit, score, seed, mapping.to_dict(),
        [row for row in rows if (row["case"], row["arm"]) in keys],
    )
    metadata["rows"] = {"computed": computed, "resumed": resumed, "recovered_bytes": recovered}
    data = summarise(rows, arm_list, [case.id for case in cases], reference=compare_to, metadata=metadata)
    files = write_summary(data, directory)
    return Summary(directory, data, files, computed, resumed, recovered)


def _checked_arms(arms: Sequence[Arm | str], compare_to: str | None, concurrency: Any) -> list[Arm]:
    """The arms parsed, with unique names that include `compare_to`; `concurrency` an int >= 1."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise UsageError(f"concurrency: expected an int >= 1, got {concurrency!r}")
    arm_list = [parse_arm(arm) if isinstance(arm, str) else arm for arm in arms]
    if not arm_list:
        raise UsageError("arms: give at least one arm, e.g. r4=state:ratio=4")
    names = [arm.name for arm in arm_list]
    if len(set(names)) != len(names):
        raise UsageError(f"arms: names must be unique, got {names}")
    if compare_to is not None and compare_to not in names:
        raise UsageError(f"--compare-to: no arm named {compare_to!r}; the arms are {', '.join(names)}")
    return arm_list


@dataclass(frozen=True)
class _Loop:
    """Cases x arms (arms inner) through `run_case`, each computed row appended to the store in
    order, rows already there reused (see the module docstring)."""

    cases: Sequence[Case]
    arms: Sequence[Arm]
    arm_specs: Mapping[str, Any]
    arm_fingerprints: Mapping[str, str]
    mapping: Any
    run_case: RunCase
    score: Scorer
    seed: int
    concurrency: int
    progress: Callable[[Progress], None] | None

    def run(self, store: ResultStore, *, retry_failed: bool) -> tuple[int, int]:
        """Compute what the store lacks (and failed rows with `retry_failed`); (computed, resumed)."""
        finished = store.latest()
        _refuse_stale(finished, self.cases, self.arms, self.arm_fingerprints)
        total = len(self.cases) * len(self.arms)
        done = computed = resumed = 0
        work = []
        for case in self.cases:
            inputs = self.mapping.inputs(case)
            for arm in self.arms:
                previous = finished.get((case.id, arm.name))
                resumed_row = previous is not None and (previous.get("status") == "finished" or not retry_failed)
                work.append((case, arm, inputs, previous if resumed_row else None))

        def compute(case: Case, arm: Arm, inputs: Mapping[str, Any]) -> CaseResult:
            return _run_one(self.run_case, self.arm_specs[arm.name], inputs, case)

        for (case, arm, _, previous), result in _in_order(work, compute, self.concurrency):
            done += 1
            if previous is not None:
                resumed += 1
                if self.progress is not None:
                    self.progress(Progress(done, total, case.id, arm.name, True, previous))
                continue
            row = result_row(case, arm, result, self.score, arm_fingerprint=self.arm_fingerprints[arm.name],
                             seed=self.seed, warmup=result.warmup or computed == 0)
            store.append(row)
            finished[(case.id, arm.name)] = row
            computed += 1
            if self.progress is not None:
                self.progress(Progress(done, total, case.id, arm.name, False, row))
        return computed, resumed


def write_summary(data: Mapping[str, Any], directory: str | os.PathLike[str]) -> dict[str, Path]:
    """summary.json (atomically replaced), both plots and report.md."""
    directory = Path(directory)
    target = directory / SUMMARY
    write_json_atomic(target, data, indent=2)
    files = {"summary": target}
    files.update(write_report(data, directory))
    return files


def result_row(case: Case, arm: Arm, result: CaseResult, scorer: Scorer, *, arm_fingerprint: str, seed: int,
               warmup: bool = False) -> dict[str, Any]:
    """The JSON row recorded for one (case, arm); `warmup` marks a run whose latency includes
    one-time costs (model loading, first forwards), which latency medians leave out."""
    correct = result.status == "finished" and result.answer is not None and scorer(result.answer, case.answers)
    evidence = dict(result.evidence) if result.evidence is not None else None
    return {
        "case": case.id,
        "arm": arm.name,
        "status": result.status,
        "error": result.error,
        "answer": result.answer,
        "correct": bool(correct),
        "scorer": scorer.name,
        "latency_s": result.latency_s,
        "warmup": bool(warmup),
        "selection_s": result.selection_s,
        "generation_s": result.generation_s,
        **hop_totals(result.hops),
        "output_positions": result.output_positions,
        "hops": [hop.to_dict() for hop in result.hops],
        "evidence": evidence,
        "evidence_at_output": None if evidence is None else evidence.get("fraction_at_output"),
        "kept": None if result.kept is None else [list(piece) for piece in result.kept],
        "case_fingerprint": case.fingerprint(),
        "arm_fingerprint": arm_fingerprint,
        "plan_fingerprint": result.plan_fingerprint,
        "model_fingerprints": dict(result.model_fingerprints),
        "greedy": result.greedy,
        "seed": seed,
        "finished_at": time.time(),
    }


# -- internals -------------------------------------------------------------------------------


def _in_order(work: list[tuple[Case, Arm, Mapping[str, Any], Any]], compute: Callable[..., CaseResult],
              concurrency: int) -> Iterator[tuple[tuple[Case, Arm, Mapping[str, Any], Any], CaseResult | None]]:
    """Each work item with its result (None for a resumed one), in `work`'s order.

    With `concurrency` > 1 up to that many runs are in flight while the caller records them
    in order; an item is handed over once it and every item before it are done, so an
    interruption loses only runs that finished ahead of an unfinished earlier one (a resume
    recomputes them). An exception a run lets through (ImportError) stops everything.
    """
    if concurrency == 1:
        for item in work:
            case, arm, inputs, previous = item
            yield item, None if previous is not None else compute(case, arm, inputs)
        return
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="experiment-run") as pool:
        futures: list[Future | None] = [
            None if previous is not None else pool.submit(compute, case, arm, inputs)
            for case, arm, inputs, previous in work
        ]
        try:
            for item, future in zip(work, futures):
                yield item, None if future is None else future.result()
        finally:
            for future in futures:
                if future is not None:
                    future.cancel()  # runs not started yet never start; running ones finish


def _run_one(run_case: RunCase, spec, inputs: Mapping[str, Any], case: Case) -> CaseResult:
    started = time.perf_counter()
    try:
        result = run_case(spec, inputs, case)
    except ImportError:
        raise  # the environment is broken (a missing package): every row would fail the same way
    except Exception as exc:  # one broken run is a failed row, not a lost experiment
        return failed_result(exc, time.perf_counter() - started)
    if not isinstance(result, CaseResult):
        raise TypeError(f"run_case: expected a CaseResult, got {type(result).__name__}")
    return result


def _check_cases(spec, arms: Sequence[Arm], blueprints, mapping, cases: Sequence[Case]) -> None:
    """Every case fits the topology and every (case, arm) plans; all problems at once."""
    problems: list[Problem] = []
    if any(arm.kind == "policy" for arm in arms):
        for case in cases:
            try:
                check_case_fits(spec, mapping, case)
            except PlanError as exc:
                problems += exc.problems
    if not problems:
        for case in cases:
            inputs = mapping.inputs(case)
            for arm in arms:
                try:
                    expand(blueprints[arm.name], inputs)
                except GraphError as exc:
                    problems += [Problem(p.code, f"case {case.id!r}, arm {arm.name!r}: {p.message}", p.fix, p.path)
                                 for p in exc.problems]
            if len(problems) >= MAX_REPORTED:
                break
    if problems:
        raise PlanError(problems[:MAX_REPORTED])


def _refuse_stale(finished: Mapping[tuple[str, str], Mapping[str, Any]], cases: Iterable[Case], arms: Sequence[Arm],
                  arm_fingerprints: Mapping[str, str]) -> None:
    for case in cases:
        case_fingerprint = case.fingerprint()
        for arm in arms:
            row = finished.get((case.id, arm.name))
            if row is None:
                continue
            if row.get("arm_fingerprint") != arm_fingerprints[arm.name]:
                raise UsageError(
                    f"results.jsonl: arm {arm.name!r} was computed for a different graph (the topology or the arm's "
                    "policy changed); use a new --out, or give the changed arm a new name"
                )
            if row.get("case_fingerprint") != case_fingerprint:
                raise UsageError(
                    f"results.jsonl: case {case.id!r} has changed since its rows were computed; "
                    "use a new --out, or give the changed case a new id"
                )


def _rescored(row: dict[str, Any], scorer: Scorer, answers: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Rows scored by another scorer (an earlier run) are rescored in memory for the summary;
    the file keeps what was recorded."""
    if row.get("scorer") == scorer.name or row.get("status") != "finished" or not isinstance(row.get("answer"), str):
        return row
    if row["case"] not in answers:
        return row
    return {**row, "correct": scorer(row["answer"], answers[row["case"]]), "scorer": scorer.name}


def _metadata(spec, topology_path, dataset_path, cases: Sequence[Case], limit, score: Scorer, seed: int,
              mapping: Mapping[str, str], rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    fingerprints: dict[str, set[str]] = {}
    for row in rows:
        for model, fingerprint in (row.get("model_fingerprints") or {}).items():
            fingerprints.setdefault(model, set()).add(fingerprint)
    greedy_flags = {row.get("greedy") for row in rows if row.get("status") == "finished"}
    return {
        "topology": {"path": str(topology_path), "name": spec.name, "spec_fingerprint": spec_fingerprint(spec)},
        "dataset": {"path": str(dataset_path), "sha256": file_sha256(dataset_path), "limit": limit, "cases": len(cases)},
        "input_mapping": dict(mapping),
        "scorer": score.name,
        "seeds": {"run": seed},
        "greedy": greedy_flags.pop() if len(greedy_flags) == 1 else (None if not greedy_flags else False),
        # one fingerprint per model when every row ran the same weights; several mean mixed rows
        "model_fingerprints": {model: sorted(values) for model, values in sorted(fingerprints.items())},
        "versions": versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def versions() -> dict[str, Any]:
    """Versions a rerun should match (packages read from metadata: nothing heavy is imported)."""
    found: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for package in ("rclc-graph", "torch", "transformers", "numpy", "pydantic"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    found["git_commit"] = _git_commit()
    return found


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
