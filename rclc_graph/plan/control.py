"""Whole-graph checks of the fields that steer a run: conditional edges (`when`), loops that
stop (`until`), function nodes (`call`) and interrupts (`interrupt`, `question`).

Field-level checks (a condition's shape, a pattern that does not compile, a function node
with a prompt) run in the spec; these need the whole graph: which nodes write text, which
edges reach a function, which loop an `until` belongs to, which code needs trust_code.
Pure: nothing is imported or called here.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import Problem
from ..spec import predicates, templates
from ..spec.models import ANSWER_VARIABLE, GraphSpec, InputSpec, NodeSpec
from .loops import Loop
from .policy import ResolvedPolicy

DEFAULT_QUESTIONS = {
    "before": "Node {node} waits for your answer before it runs (your answer is what its prompt reads as {{answer}}).",
    "after": "Node {node} finished; read its output and answer (your answer is added after its output).",
}


def check_control(
    spec: GraphSpec,
    nodes: Mapping[str, NodeSpec],
    inputs: Mapping[str, InputSpec],
    policies: tuple[ResolvedPolicy, ...],
    loops: tuple[Loop, ...],
    loop_of: Mapping[str, int],
    *,
    trust_code: bool,
    functions: Mapping[str, Callable[..., Any]],
) -> list[Problem]:
    """Every problem of the steering fields, found at once."""
    position = {node.name: index for index, node in enumerate(spec.nodes)}
    problems: list[Problem] = []
    problems += _trust(spec, trust_code, functions)
    for index, edge in enumerate(spec.edges):
        source, target = nodes[edge.source], nodes[edge.target]
        mode = policies[index].mode
        if mode != "text" and (source.is_function or target.is_function):
            function = edge.source if source.is_function else edge.target
            problems.append(Problem(
                "E_FUNCTION",
                f"a {mode} edge {edge.source} -> {edge.target} touches function node {function}, which has no model "
                "state to send or receive",
                "remove the edge's policy (a plain edge into or out of a function carries text), or write "
                "policy: {mode: text}",
                ("edges", index, "policy"),
            ))
        for field_name in ("when", "until"):
            if getattr(edge, field_name) is not None and not source.generate:
                problems.append(Problem(
                    "E_GENERATE",
                    f"edge {edge.source} -> {edge.target} has {field_name}, which reads {edge.source}'s output, but "
                    f"{edge.source} has generate: false and writes none",
                    f"set generate: true on {edge.source}, or remove {field_name}",
                    ("edges", index, field_name),
                ))
    for loop in loops:
        if loop.until is None:
            continue
        edge = spec.edges[loop.until]
        if nodes[edge.source].foreach is not None:
            problems.append(Problem(
                "E_LOOP",
                f"until on edge {edge.source} -> {edge.target} reads {edge.source}, a foreach node with one copy per "
                "item; until reads one node's output",
                "put until on a loop edge whose source has no foreach",
                ("edges", loop.until, "until"),
            ))
        for name in loop.nodes:
            if nodes[name].output:
                problems.append(Problem(
                    "E_LOOP",
                    f"output node {name} sits in a loop that may stop early (until on edges[{loop.until}]), so no "
                    "single round of it is the answer",
                    f"mark a node after the loop as output and give it an edge from {name} (edges leaving the loop "
                    "start from the round it stopped at)",
                    ("nodes", position[name], "output"),
                ))
    for name, node in nodes.items():
        problems += _interrupt_problems(node, position[name], inputs)
    return problems


def _trust(spec: GraphSpec, trust_code: bool, functions: Mapping[str, Callable[..., Any]]) -> list[Problem]:
    """Function nodes and routers name code to import; that needs trust_code (a callable the
    builder was handed is not imported, so it needs none)."""
    if trust_code:
        return []
    problems = []
    for index, node in enumerate(spec.nodes):
        if node.call is not None and node.call not in functions:
            problems.append(Problem(
                "E_TRUST_CODE",
                f"call {node.call!r} would import and run code named by the YAML",
                "pass --trust-code (trust_code=True) if you trust this file",
                ("nodes", index, "call"),
            ))
    for index, edge in enumerate(spec.edges):
        for field_name in ("when", "until"):
            for reference in predicates.routers(getattr(edge, field_name)):
                problems.append(Problem(
                    "E_TRUST_CODE",
                    f"{field_name} router {reference!r} would import and run code named by the YAML",
                    "pass --trust-code (trust_code=True) if you trust this file, or write a condition mapping",
                    ("edges", index, field_name),
                ))
    return problems


def _interrupt_problems(node: NodeSpec, index: int, inputs: Mapping[str, InputSpec]) -> list[Problem]:
    problems: list[Problem] = []
    reads_answer = any(found.name == ANSWER_VARIABLE for found in templates.fields(node.prompt))
    if node.interrupt == "before" and not node.is_function:
        if not reads_answer:
            problems.append(Problem(
                "E_INTERRUPT",
                f"node {node.name} stops before it runs for a person's answer, but its prompt does not use {{answer}}",
                "put {answer} in the prompt where the answer belongs, e.g. \"Reviewer's notes: {answer}\"",
                ("nodes", index, "prompt"),
            ))
        if ANSWER_VARIABLE in inputs:
            problems.append(Problem(
                "E_INTERRUPT",
                f"input {ANSWER_VARIABLE!r} would hide the person's answer in node {node.name}'s prompt",
                f"rename the input {ANSWER_VARIABLE!r}",
                ("nodes", index, "interrupt"),
            ))
    if node.interrupt == "after" and not node.generate:
        problems.append(Problem(
            "E_INTERRUPT",
            f"node {node.name} has interrupt: after, but generate: false: it writes nothing to show",
            "set generate: true, or use interrupt: before",
            ("nodes", index, "interrupt"),
        ))
    return problems


def answer_variable(node: NodeSpec) -> bool:
    """Whether `{answer}` is a template variable of this node (agents with interrupt: before)."""
    return node.interrupt == "before" and not node.is_function
