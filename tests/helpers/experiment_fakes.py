"""A model-free run_case for experiment tests: the real scheduler with `rclc_graph.testing.FakeExecutor`.

`simulate(plan, case)` runs a real Plan through `run_plan` on a fake executor configured for
experiments, so the experiment code that reads the RunResult (case results, evidence
survival, the runner) is exercised exactly as with a model. "Tokens" are words. Selection is
a fixed rule (state with a ratio: keep inherited rows and every r-th own row; with a budget:
the most recent rows; full: all), and the answering node answers correctly when at least half
of the gold evidence reached it (or its text is in its prompt). Nothing here is a model.
"""

from __future__ import annotations

import math
from typing import Any

from rclc_graph.experiments.case_result import CaseResult, case_result_from_run
from rclc_graph.experiments.evidence import evidence_survival
from rclc_graph.plan import compile_plan
from rclc_graph.results import RunResult
from rclc_graph.run import run_plan_sync
from rclc_graph.testing import FakeExecutor, NodeReading

BYTES_PER_POSITION = 576 * 4  # a float32 row of a 576-wide model


def kept_positions(edge: Any, sender: Any) -> list[int]:
    """The fixed selection rule of the module docstring."""
    policy, total, inherited = edge.policy, sender.positions, sender.inherited_positions
    if policy.mode == "full":
        return list(range(total))
    if policy.budget is not None:
        budget = min(policy.budget, total)
        return list(range(total - budget, total))
    ratio = policy.ratio
    budget = inherited + math.ceil((total - inherited) / ratio)
    own = list(range(inherited, total, ratio))
    return (list(range(inherited)) + own)[:budget]


def simulate(plan, case, *, fail_on: str | None = None) -> RunResult:
    """Run `plan` on `case` without a model; a node whose prompt contains `fail_on` fails."""

    def text(reading: NodeReading) -> str:
        if reading.node.output:
            return _answer(reading, case)
        return _report(reading.state.prompt_text, case)

    def failure(node: Any) -> BaseException | None:
        if fail_on is not None and fail_on in node.prompt:
            return RuntimeError(f"simulated failure in {node.name}")
        return None

    executor = FakeExecutor(text=text, keep=kept_positions, fail=failure, bytes_per_position=BYTES_PER_POSITION,
                            selection_seconds=0.01, generation_seconds=0.1)
    return run_plan_sync(plan, executor=executor)


def _report(prompt_text: str, case) -> str:
    """A sender's "report": the evidence sentence when it read it, else a shrug."""
    if case.evidence and case.evidence in prompt_text:
        return f"Found: {case.evidence}"
    return "Nothing relevant here."


def _answer(reading: NodeReading, case) -> str:
    if case.evidence and case.evidence in reading.state.prompt_text:
        return f"It is {case.answers[0]}."
    nodes = {**reading.earlier, reading.node.name: reading.state}
    hops = [hop for result in reading.earlier.values() for hop in result.hops] + list(reading.state.hops)
    survival = evidence_survival(nodes, hops, [reading.node.name], evidence=case.evidence, document=case.gold_text)
    if survival is not None and survival.fraction_at_output is not None and survival.fraction_at_output >= 0.5:
        return f"It is {case.answers[0]}."
    return "I do not know."


class FakeRunCase:
    """An injectable run_case: plans, simulates, converts; counts its calls."""

    def __init__(self, fail_on: str | None = None, raise_on: str | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on
        self.raise_on = raise_on

    def __call__(self, spec, inputs, case) -> CaseResult:
        self.calls.append((case.id, spec.name))
        if self.raise_on is not None and self.raise_on == case.id:
            raise RuntimeError("simulated crash")
        plan = compile_plan(spec, inputs)
        run = simulate(plan, case, fail_on=self.fail_on)
        return case_result_from_run(run, plan, case, model_fingerprints={"base": "fake-fingerprint"})
