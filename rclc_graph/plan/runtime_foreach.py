"""Run-time foreach: a node copied once per item of a JSON list an earlier node writes.

`foreach: {node: planner, max_items: 8}` is LangGraph's `Send` for a topology that is planned
before it runs. The plan holds `max_items` copies (`worker[0]` ... `worker[7]`), each waiting
for `planner` as if an edge joined them (none needs to); when `planner` finished, copy i runs
with item i of its list as `{item}` (or the node's `item` name) and `{index}`, and the copies
past the list's end are skipped. Edges behave as for a foreach over an input: into every copy,
out of every copy that ran (fan-in), copy i to copy i between two nodes over the same list.

What the list must be, and the bounds (checked when `planner` finished; a bad list fails the
node, naming the producer and what was wrong): the producer's whole output read as JSON, or
the first JSON array in it (models wrap JSON in prose and code fences); a list of at most
`max_items` (default 16, at most 256) non-empty strings, each at most MAX_NODE_TEXT_BYTES. An
empty list skips every copy.

What validation checks here: the producer exists, is not the node itself, has no copies of its
own, writes text, and neither it nor the node sits in a loop. The producer-to-node dependency
also orders the plan, closes cycles (E_CYCLE) and counts for reachability (validate.py,
loops.py). The rest of this module is the run-time side: reading the list and giving a copy
its item (the scheduler's, on any executor, so a copy reaches its executor complete).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..errors import Problem, UsageError
from ..spec import predicates, templates
from ..spec.models import ANSWER_VARIABLE, MAX_NODE_TEXT_BYTES, GraphSpec, NodeSpec
from .dag import Plan, PlanEdge, PlanNode


def dependencies(spec: GraphSpec) -> tuple[tuple[str, str], ...]:
    """(producer, node) for every run-time foreach node of `spec` whose producer exists."""
    names = {node.name for node in spec.nodes}
    return tuple((node.foreach_node, node.name) for node in spec.nodes
                 if node.foreach_node is not None and node.foreach_node in names)


def foreach_problems(spec: GraphSpec, nodes: Mapping[str, NodeSpec], loop_of: Mapping[str, int]) -> list[Problem]:
    """Every run-time foreach that cannot work (references are checked in validate.py)."""
    problems: list[Problem] = []
    for index, node in enumerate(spec.nodes):
        producer_name = node.foreach_node
        if producer_name is None or producer_name not in nodes:
            continue
        path = ("nodes", index, "foreach")
        producer = nodes[producer_name]
        if producer_name == node.name:
            problems.append(Problem("E_FOREACH", f"node {node.name} ranges over its own output",
                                    "range over the list an earlier node writes", path))
        elif producer.foreach is not None:
            problems.append(Problem(
                "E_FOREACH", f"node {node.name} ranges over the output of {producer_name}, which has one copy per item; "
                "the list must come from one node", f"let a node after {producer_name}'s copies write the list",
                path))
        elif not producer.generate:
            problems.append(Problem(
                "E_FOREACH", f"node {node.name} ranges over the output of {producer_name}, which has generate: false "
                "and writes no text", f"set generate: true on {producer_name}", path))
        for name in (node.name, producer_name):
            if name in loop_of:
                problems.append(Problem(
                    "E_FOREACH", f"run-time foreach of node {node.name} over {producer_name}: {name} sits in a loop, "
                    "and a loop's rounds would each write a list", "range over a node outside the loop, and keep "
                    "the foreach node outside it", path))
                break
    return problems


# -- at run time -----------------------------------------------------------------------------------


def read_items(text: str, producer: str, node: str, max_items: int) -> list[str]:
    """The list `producer` wrote, for the copies of `node`: UsageError saying what is wrong
    with it (not a JSON list, too long, an item that is not a non-empty string or too long)."""
    value = predicates.read_json(text)
    where = f"foreach of node {node} over the output of {producer}"
    fix = f"make {producer} write a JSON list of strings, e.g. [\"first\", \"second\"]"
    if not isinstance(value, list):
        found = "no JSON value" if value is None else f"a JSON {_kind(value)}"
        raise UsageError(f"{where}: expected a JSON list of strings, found {found} in {_excerpt(text)}; {fix}")
    if len(value) > max_items:
        raise UsageError(f"{where}: the list has {len(value)} items, more than max_items {max_items}; "
                         f"raise max_items (at most 256) or make {producer} write fewer")
    for position, item in enumerate(value):
        if not isinstance(item, str):
            raise UsageError(f"{where}: item {position} is a JSON {_kind(item)} ({_excerpt(str(item))}), not a string; "
                             f"{fix}")
        if not item.strip():
            raise UsageError(f"{where}: item {position} is empty; {fix} without empty items")
        if len(item.encode("utf-8", "surrogatepass")) > MAX_NODE_TEXT_BYTES:
            raise UsageError(f"{where}: item {position} is more than {MAX_NODE_TEXT_BYTES} bytes")
    return value


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null")


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def with_item(plan: Plan, node: PlanNode, item: str) -> PlanNode:
    """Copy `node` of a run-time foreach with its item: prompt, prompt spans and question
    rendered as compile.py renders a foreach copy's."""
    variables = item_variables(plan, node, item)
    prompt, spans = templates.render_spans(node.template, variables)
    spec = plan.spec_node(node)
    question = node.question
    if spec.question is not None:
        question = templates.render(spec.question, variables)
    return replace(node, prompt=prompt, prompt_values=spans, item=item, question=question)


def edge_with_item(plan: Plan, edge: PlanEdge, target: PlanNode, item: str) -> PlanEdge:
    """`edge` into a run-time foreach copy with its selection request rendered for the item."""
    if edge.policy.request is None:
        return edge
    return replace(edge, request=templates.render(edge.policy.request, item_variables(plan, target, item)))


def item_variables(plan: Plan, node: PlanNode, item: str) -> dict[str, Any]:
    """The template variables of a run-time foreach copy once its item is known."""
    spec = plan.spec_node(node)
    variables: dict[str, Any] = dict(plan.scope_inputs(node.scope))
    variables[spec.item] = item
    variables["index"] = node.index
    if node.answer is not None or (spec.interrupt == "before" and not spec.is_function):
        variables[ANSWER_VARIABLE] = node.answer or ""
    return variables
