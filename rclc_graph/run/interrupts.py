"""Human in the loop: which nodes of a run wait for a person, what they are shown, and how
an answer enters the run.

Three ways a node waits (the scheduler detects them; docs/graphs.md#human-in-the-loop):

- `interrupt: before`, no answer yet: the node does not run. Its answer becomes `{answer}`
  in its prompt (a function node gets `inputs["answer"]`); the person is shown what its
  senders wrote.
- `interrupt: after`: the node runs and is recorded; the run then waits with its output
  shown. The answer is appended to that output, on its own paragraph, for everything
  downstream: receivers, conditions and the run's outputs (`NodeResult.effective_text`).
- a function node raises `Interrupt(question)`: it did not finish; with an answer it runs
  again and finds it in `inputs["answer"]`.

Answers are part of the plan (`compile_plan(..., answers=...)`), not of its fingerprint, so
a waiting run resumed with an answer is the same run as one given that answer up front:
every node computes the same thing in both (tests/unit/rclc_graph/run/test_graph_interrupts.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..plan.dag import Plan
from ..results.run_result import NodeResult


def with_answers(plan: Plan, results: dict[str, NodeResult]) -> dict[str, NodeResult]:
    """`results` with each `interrupt: after` node's answer attached (when the run has one)."""
    for name, result in results.items():
        node = plan.node(name)
        if node.interrupt == "after" and node.answer is not None and result.answer != node.answer:
            results[name] = replace(result, answer=node.answer)
    return results


class Waiting:
    """The nodes of one run that wait for a person, in the order they began waiting."""

    def __init__(self) -> None:
        self._asked: dict[str, tuple[str, str]] = {}  # node -> (before | after | raised, question)

    def add(self, name: str, when: str, question: str) -> None:
        self._asked.setdefault(name, (when, question))

    def __contains__(self, name: object) -> bool:
        return name in self._asked

    def __bool__(self) -> bool:
        return bool(self._asked)

    def described(self, plan: Plan, results: Mapping[str, NodeResult], fired: Mapping[int, bool]) -> list[dict[str, Any]]:
        """Plain data per waiting node: node, question, `interrupt` (before, after or raised)
        and `shown`: what the person reads before answering (the node's output for after,
        otherwise the texts of the senders whose edges fired: what the node reads, not every
        sender that happened to finish). `fired`: the run's decisions of conditional edges."""
        described = []
        for name, (when, question) in self._asked.items():
            if when == "after":
                shown = {name: results[name].effective_text}
            else:
                shown = {edge.source: results[edge.source].effective_text for edge in plan.incoming(name)
                         if edge.source in results and results[edge.source].text is not None
                         and (fired.get(edge.id, False) if edge.conditional else True)}
            described.append({"node": name, "question": question, "interrupt": when, "shown": shown})
        return described
