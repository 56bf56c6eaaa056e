"""What one (case, arm) run produced, in the figures an experiment records.

`run_case(spec, inputs, case) -> CaseResult` is the seam between the experiment loop and the
scheduler: the default (`scheduler_run_case`) plans the arm's graph for the case's inputs, runs
it with `rclc_graph.run.run_plan_sync` and converts the scheduler's RunResult with
`case_result_from_run`; tests inject their own function (or run the scheduler with
`rclc_graph.testing.FakeExecutor`) and need no model.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..executors import ModelPool
from ..plan.compile import compile_plan
from ..plan.dag import Plan
from ..run.scheduler import run_plan_sync
from ..spec.models import GraphSpec
from .datasets import Case
from .evidence import evidence_survival
from .kept_text import kept_text
from ..errors import UsageError


@dataclass(frozen=True)
class HopFigures:
    """One handoff, as recorded: positions the sender held (sent to selection) and kept."""

    source: str
    target: str
    mode: str
    policy: str
    sent_positions: int  # T: positions of the sender state the selector saw
    inherited_positions: int
    budget: int
    kept_positions: int
    payload_bytes: int
    selection_s: float
    edge: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_record(cls, record: Any) -> HopFigures:
        """From a lineage.HopRecord (or anything with its fields): each field is the record's
        field of the same name (`sent_positions` and `selection_s` are its total_positions and
        selection_seconds), as an int or float where this class says so."""
        values = {}
        for item in dataclasses.fields(cls):
            value = getattr(record, _RECORD_NAMES.get(item.name, item.name))
            values[item.name] = _CASTS[str(item.type)](value) if str(item.type) in _CASTS else value
        return cls(**values)


_RECORD_NAMES = {"sent_positions": "total_positions", "selection_s": "selection_seconds"}
_CASTS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float}


@dataclass(frozen=True)
class CaseResult:
    """The outcome of running one arm's graph on one case.

    `status` is "finished", "failed" or "cancelled"; a failed run keeps its `error` and has
    no answer. `latency_s` is end-to-end wall time; `generation_s` sums the nodes' decoding
    time and `selection_s` the hops' selection time.
    """

    answer: str | None
    latency_s: float
    status: str = "finished"
    error: str | None = None
    selection_s: float = 0.0
    generation_s: float = 0.0
    hops: tuple[HopFigures, ...] = ()
    output_positions: int | None = None  # positions in the answering node's state
    evidence: Mapping[str, Any] | None = None  # EvidenceSurvival.to_dict()
    kept: tuple[tuple[str, str], ...] | None = None  # [origin, text] the answering node received (kept_text)
    model_fingerprints: Mapping[str, str] = field(default_factory=dict)
    plan_fingerprint: str | None = None
    greedy: bool | None = None  # every agent decodes greedily: a rerun must give the same answer
    warmup: bool = False  # the run loaded a model: its latency includes one-time costs

    def __post_init__(self) -> None:
        if self.status not in ("finished", "failed", "cancelled"):
            raise UsageError(f"status: expected finished, failed or cancelled, got {self.status!r}")
        if self.status == "finished" and not isinstance(self.answer, str):
            raise UsageError("answer: a finished run needs its answer text")


RunCase = Callable[[GraphSpec, Mapping[str, Any], Case], CaseResult]


def case_result_from_run(run: Any, plan: Plan, case: Case, *, model_fingerprints: Mapping[str, str] | None = None) -> CaseResult:
    """Convert the scheduler's RunResult of `plan` on `case` into the recorded figures."""
    output = plan.outputs[0] if len(plan.outputs) == 1 else None
    if output is None:
        raise UsageError(f"plan {plan.name!r}: an experiment scores one answer, the plan has {len(plan.outputs)} outputs")
    nodes: Mapping[str, Any] = run.nodes
    answer = run.outputs.get(output) if run.status == "finished" else None
    evidence = kept = None
    if run.status == "finished":
        survival = evidence_survival(nodes, run.hops, plan.outputs, items=case.evidence_items())
        evidence = None if survival is None else survival.to_dict()
        pieces = kept_text(nodes, output)
        kept = None if pieces is None else tuple((origin, text) for origin, text in pieces)
    hops = tuple(HopFigures.from_record(record) for record in run.hops)
    return CaseResult(
        answer=answer,
        latency_s=float(run.seconds),
        status=run.status,
        error=run.error,
        selection_s=sum(hop.selection_s for hop in hops),
        generation_s=sum(float(node.generation_seconds) for node in nodes.values()),
        hops=hops,
        output_positions=int(nodes[output].positions) if output in nodes else None,
        evidence=evidence,
        kept=kept,
        model_fingerprints=dict(model_fingerprints or {}),
        plan_fingerprint=plan.fingerprint(),
        greedy=all(node.agent.greedy for node in plan.nodes),
    )


def failed_result(error: BaseException, latency_s: float) -> CaseResult:
    """A run that raised before the scheduler could report (planning, loading, a bug)."""
    return CaseResult(answer=None, latency_s=latency_s, status="failed", error=f"{type(error).__name__}: {error}")


def scheduler_run_case(
    *, trust_code: bool = False, seed: int = 0, pool: ModelPool | None = None, max_batch: int | None = None
) -> RunCase:
    """The default `run_case`: plan, run with the scheduler, convert. Models are loaded once
    (by one shared ModelPool) and reused for every case; concurrent calls (an experiment's
    `concurrency`) share it too, so their generations batch together. `max_batch` caps the
    pool's batches (`ModelPool.set_max_batch`)."""
    state: dict[str, Any] = {"pool": pool}
    lock = threading.Lock()

    def shared_pool() -> ModelPool:
        with lock:
            if state["pool"] is None:
                state["pool"] = ModelPool()
            if max_batch is not None and state["pool"].max_batch != max_batch:
                state["pool"].set_max_batch(max_batch)
            return state["pool"]

    def run_case(spec: GraphSpec, inputs: Mapping[str, Any], case: Case) -> CaseResult:
        models = shared_pool()
        plan = compile_plan(spec, inputs, trust_code=trust_code)
        loads = models.loads
        run = run_plan_sync(plan, pool=models, seed=seed)
        fingerprints = {model.name: models.get(model).fingerprint for model in plan.models()}
        result = case_result_from_run(run, plan, case, model_fingerprints=fingerprints)
        # With concurrent cases, every run in flight while a model loaded waited for it: all count as warm-up.
        return dataclasses.replace(result, warmup=models.loads > loads)

    return run_case


def hop_totals(hops: Sequence[HopFigures]) -> dict[str, int]:
    return {
        "positions_sent": sum(hop.sent_positions for hop in hops),
        "positions_kept": sum(hop.kept_positions for hop in hops),
        "payload_bytes": sum(hop.payload_bytes for hop in hops),
    }
