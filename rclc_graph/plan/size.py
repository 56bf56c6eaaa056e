"""How big a plan would be, computed before anything is unrolled or expanded.

Loops are unrolled and foreach nodes copied before a run starts, so a 500-byte topology with
`rounds: 1000000` (or a list input of a million items) describes a plan that takes minutes
and gigabytes to build. The sizes are plain arithmetic on the spec and the inputs, so we
compute them first and refuse a plan above the guards (`rounds.max_nodes`, and
`MAX_EDGES_PER_NODE` edges per allowed node) before building anything. A file may lower
the guards freely but raise them only up to the hard caps of `spec/models/graph.py`
(`RoundsSpec`), so no file can ask for an unbounded plan.
"""

from __future__ import annotations

from typing import Mapping

from ..errors import Problem
from ..spec.models import GraphSpec, NodeSpec
from .loops import Loop

MAX_EDGES_PER_NODE = 16  # a plan may hold max_nodes * 16 edges (fan-ins of foreach copies)


def max_edges(spec: GraphSpec) -> int:
    """The most edges a plan of `spec` may hold."""
    return spec.rounds.max_nodes * MAX_EDGES_PER_NODE


def _too_large(what: str, count: int, limit: int, fix: str) -> Problem:
    return Problem(
        "E_TOO_LARGE",
        f"the plan would hold {count} {what}, more than the {limit} allowed (rounds.max_nodes = the node limit; "
        f"edges: {MAX_EDGES_PER_NODE} per allowed node)",
        fix,
        ("rounds", "max_nodes"),
    )


def unrolled_size_problems(
    spec: GraphSpec, nodes: Mapping[str, NodeSpec], loops: tuple[Loop, ...], loop_of: Mapping[str, int]
) -> list[Problem]:
    """Steps and step edges that unrolling the loops would create, checked before unrolling."""
    rounds = {name: loops[index].rounds for name, index in loop_of.items()}
    steps = sum(rounds.get(name, 1) for name in nodes)
    edges = 0
    for edge in spec.edges:
        if edge.rounds is not None:
            edges += edge.rounds - 1
        elif edge.source in rounds and loop_of[edge.source] == loop_of.get(edge.target):
            edges += rounds[edge.source]
        else:
            edges += 1
    return _over_limits(spec, steps, edges, "use fewer rounds or nodes in loops, or raise rounds.max_nodes (up to its cap)")


def expanded_size_problems(spec: GraphSpec, steps: list[str], step_edges: list[tuple[str, str]],
                           copies: Mapping[str, int]) -> list[Problem]:
    """Nodes and edges of the plan that expanding foreach copies would create: `steps` are the
    declared node of every step, `step_edges` (source node, target node) of every step edge."""
    nodes = sum(copies[name] for name in steps)
    foreach = {name for name, node in _nodes(spec).items() if node.foreach is not None}
    edges = 0
    for source, target in step_edges:
        if source in foreach and target in foreach:
            edges += copies[source]  # paired copies (same list: validation checked)
        else:
            edges += copies[source] * copies[target]
    return _over_limits(spec, nodes, edges, "use fewer list items or rounds, or raise rounds.max_nodes (up to its cap)")


def _over_limits(spec: GraphSpec, nodes: int, edges: int, fix: str) -> list[Problem]:
    """A problem for each of `nodes` and `edges` above what the spec allows, with `fix`."""
    problems = []
    if nodes > spec.rounds.max_nodes:
        problems.append(_too_large("nodes", nodes, spec.rounds.max_nodes, fix))
    if edges > max_edges(spec):
        problems.append(_too_large("edges", edges, max_edges(spec), fix))
    return problems


def _nodes(spec: GraphSpec) -> dict[str, NodeSpec]:
    return {node.name: node for node in spec.nodes}
