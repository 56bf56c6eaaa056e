"""A model-free stand-in for the scheduler, for experiment tests.

`simulate(plan, case)` walks a real Plan in order and produces RunResult/NodeResult-shaped
objects with real lineages (built with rclc_graph.lineage), so the experiment code that reads
them (case results, evidence survival, the runner) is exercised exactly as with the scheduler.
"Tokens" are whitespace-separated words with their character offsets. Selection is a fixed
rule (state with a ratio: keep inherited rows and every r-th own row; with a budget: the most
recent rows; full: all), and the answering node answers correctly when at least half of the
gold evidence reached it (or its text is in its prompt). Nothing here is a model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from rclc_graph.experiments.case_result import CaseResult, case_result_from_run
from rclc_graph.experiments.evidence import evidence_survival
from rclc_graph.lineage import HopRecord, Lineage, compose_hop, receiver_lineage
from rclc_graph.plan import compile_plan

_WORD = re.compile(r"\S+")


@dataclass
class FakeNode:
    node: str
    text: str | None
    positions: int
    inherited_positions: int
    lineage: Lineage
    prompt_text: str
    prompt_start: int
    prompt_offsets: list[tuple[int, int]]
    generation_seconds: float
    started_at: float = 0.0
    finished_at: float = 0.0


@dataclass
class FakeRun:
    run_id: str
    status: str
    outputs: dict[str, str]
    nodes: dict[str, FakeNode]
    hops: list[HopRecord]
    error: str | None = None
    seconds: float = 0.0
    calls: list[str] = field(default_factory=list)


def offsets(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in _WORD.finditer(text)]


def _kept(policy: Any, total: int, inherited: int) -> tuple[list[int], int]:
    if policy.mode == "full":
        return list(range(total)), total
    if policy.budget is not None:
        budget = min(policy.budget, total)
        return list(range(total - budget, total)), budget
    ratio = policy.ratio
    budget = inherited + math.ceil((total - inherited) / ratio)
    own = list(range(inherited, total, ratio))
    return (list(range(inherited)) + own)[:budget], budget


def simulate(plan, case, *, fail_on: str | None = None) -> FakeRun:
    nodes: dict[str, FakeNode] = {}
    hops: list[HopRecord] = []
    for position, node in enumerate(plan.nodes):
        if fail_on is not None and fail_on in node.prompt:
            return FakeRun("fake", "failed", {}, nodes, hops, error=f"simulated failure in {node.name}", seconds=0.5)
        handoffs: list[Lineage] = []
        texts: list[str] = []
        for edge in plan.incoming(node.name):
            sender = nodes[edge.source]
            if edge.policy.mode == "text":
                texts.append(sender.text or "")
                hops.append(HopRecord(edge.id, edge.source, edge.target, "text", "text", sender.positions,
                                      sender.inherited_positions, 0, 0, 0, {}, {}, len((sender.text or "").encode()), 0.0, 0.0))
                continue
            kept, budget = _kept(edge.policy, sender.positions, sender.inherited_positions)
            hop = compose_hop(sender.lineage, kept, source=edge.source, target=edge.target,
                              inherited_positions=sender.inherited_positions, budget=budget,
                              payload_bytes=len(kept) * 576 * 4, mode=edge.policy.mode, policy=edge.policy.label,
                              edge=edge.id, selection_seconds=0.01)
            handoffs.append(hop.lineage)
            hops.append(hop.record)
        prompt_text = "\n\n".join(texts + [node.prompt])
        prompt_offsets = offsets(prompt_text)
        inherited = sum(len(lineage) for lineage in handoffs)
        lineage = receiver_lineage(node.name, handoffs, len(prompt_offsets))
        text = None
        if node.generate:
            partial = FakeNode(node.name, None, len(lineage), inherited, lineage, prompt_text, inherited, prompt_offsets, 0.0)
            text = _answer(plan, node, partial, nodes, hops, case) if node.output else _report(prompt_text, case)
            lineage = lineage.extend(node.name, len(text.split()), "token")
        nodes[node.name] = FakeNode(node.name, text, len(lineage), inherited, lineage, prompt_text, inherited, prompt_offsets,
                                    0.1 if node.generate else 0.0, float(position), float(position) + 1)
    outputs = {name: nodes[name].text or "" for name in plan.outputs}
    return FakeRun("fake", "finished", outputs, nodes, hops, seconds=1.0 + 0.1 * len(hops))


def _report(prompt_text: str, case) -> str:
    """A sender's "report": the evidence sentence when it read it, else a shrug."""
    if case.evidence and case.evidence in prompt_text:
        return f"Found: {case.evidence}"
    return "Nothing relevant here."


def _answer(plan, node, partial: FakeNode, nodes, hops, case) -> str:
    if case.evidence and case.evidence in partial.prompt_text:
        return f"It is {case.answers[0]}."
    survival = evidence_survival({**nodes, node.name: partial}, hops, [node.name], evidence=case.evidence,
                                 document=case.gold_text)
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
