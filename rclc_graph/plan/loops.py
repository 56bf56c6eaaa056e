"""Bounded loops: find them (strongly connected components closed by `rounds` edges) and
unroll them into steps, a declared node in one round.

An edge with `rounds: k` is a loop edge: it feeds round r into round r + 1. Nodes joined by
cycles form a loop group; each runs once per round. Plain edges inside a group connect nodes
of the same round; edges entering a group reach its first round and edges leaving it start
from its last. Removing loop edges must leave a DAG, otherwise the cycle is undeclared.
Nested loops (one group with loop edges of different counts) are refused.

A loop whose loop edge carries `until` may stop after any round: its leaving edges are then
unrolled from every round (round r's fire when the loop stops after round r, see
compile.py's `LoopStop`), so whatever follows the loop reads the round it stopped at.
Planning stays pure and bounded: the rounds a stop skips are in the plan, marked skipped
at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import networkx as nx

from ..errors import PlanError, Problem
from ..spec.models import GraphSpec, NodeSpec


@dataclass(frozen=True)
class Step:
    """A declared node in one round; `round` is None for nodes outside loops."""

    node: str
    round: int | None = None

    @property
    def name(self) -> str:
        return self.node if self.round is None else f"{self.node}@{self.round}"


@dataclass(frozen=True)
class StepEdge:
    edge: int  # index into spec.edges
    source: Step
    target: Step
    loop: bool  # a loop edge (round r -> r + 1)


@dataclass(frozen=True)
class Loop:
    nodes: tuple[str, ...]  # declaration order
    rounds: int
    edges: tuple[int, ...]  # indices of its loop edges in spec.edges
    until: int | None = None  # index of the loop edge whose `until` may stop the loop early

    def check_node(self, spec: GraphSpec) -> str | None:
        """The declared node whose output `until` reads after each round (the until edge's source)."""
        return None if self.until is None else spec.edges[self.until].source


def find_loops(
    spec: GraphSpec, nodes: Mapping[str, NodeSpec], implied: tuple[tuple[str, str], ...] = ()
) -> tuple[tuple[Loop, ...], dict[str, int]]:
    """The spec's bounded loops (strongly connected parts closed by `rounds` edges) and the loop
    of each node in one; PlanError for a cycle that is no declared loop, or malformed loop edges.
    `implied` are (producer, node) dependencies that are not edges (run-time foreach), which
    order nodes like edges do."""
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(implied)
    for edge in spec.edges:
        graph.add_edge(edge.source, edge.target)
    _refuse_plain_cycles(spec, nodes, implied)
    rank = {name: position for position, name in enumerate(nodes)}
    components = sorted(
        (sorted(component, key=rank.__getitem__) for component in nx.strongly_connected_components(graph)),
        key=lambda members: rank[members[0]],
    )
    component_of = {name: position for position, members in enumerate(components) for name in members}
    problems: list[Problem] = []
    loop_edges = _loop_edges(spec, component_of, problems)
    loops: list[Loop] = []
    loop_of: dict[str, int] = {}
    for component, indices in loop_edges.items():
        loop = _loop(spec, components[component], indices, problems)
        if loop is not None:
            for name in loop.nodes:
                loop_of[name] = len(loops)
            loops.append(loop)
    if problems:
        raise PlanError(problems)
    return tuple(loops), loop_of


def _refuse_plain_cycles(spec: GraphSpec, nodes: Mapping[str, NodeSpec], implied: tuple[tuple[str, str], ...]) -> None:
    """PlanError (E_CYCLE) for a cycle of edges without `rounds` (run-time foreach waits
    included): every cycle must be a declared loop."""
    plain = nx.DiGraph()
    plain.add_nodes_from(nodes)
    plain.add_edges_from(implied)
    edge_index: dict[tuple[str, str], int] = {}
    for index, edge in enumerate(spec.edges):
        edge_index[(edge.source, edge.target)] = index
        if edge.rounds is None:
            plain.add_edge(edge.source, edge.target)
    try:
        cycle = nx.find_cycle(plain)
    except nx.NetworkXNoCycle:
        return
    names = " -> ".join([source for source, _ in cycle] + [cycle[0][0]])
    closing = cycle[-1][:2]
    waits = bool(set(implied) & {pair[:2] for pair in cycle})
    position = {name: index for index, name in enumerate(nodes)}
    path = ("edges", edge_index[closing]) if closing in edge_index else ("nodes", position[closing[1]], "foreach")
    raise PlanError([Problem(
        "E_CYCLE",
        f"cycle {names} is not a declared loop" + (" (a run-time foreach waits for the node it ranges over)"
                                                   if waits else ""),
        "set rounds: k on the edge that closes the loop (it feeds round r into r + 1), or remove an edge",
        path,
    )])


def _loop_edges(spec: GraphSpec, component_of: Mapping[str, int], problems: list[Problem]) -> dict[int, list[int]]:
    """The `rounds` edges of each strongly connected component; a problem for each that closes no
    loop (appended to `problems`) or asks for more rounds than the limit."""
    loop_edges: dict[int, list[int]] = {}
    for index, edge in enumerate(spec.edges):
        if edge.rounds is None:
            continue
        if component_of[edge.source] != component_of[edge.target]:
            problems.append(_loop_problem(f"edge {edge.source} -> {edge.target} has rounds but closes no loop",
                                          "drop rounds (a plain edge), or add the edge that leads back", index))
            continue
        if edge.rounds > spec.rounds.limit:
            problems.append(_loop_problem(f"rounds {edge.rounds} is above the limit of {spec.rounds.limit}",
                                          "lower rounds, or raise rounds.limit in the graph", index))
        loop_edges.setdefault(component_of[edge.source], []).append(index)
    return loop_edges


def _loop(spec: GraphSpec, members: list[str], indices: list[int], problems: list[Problem]) -> Loop | None:
    """The loop of one component from its loop edges, or None with a problem appended when they
    disagree on rounds or more than one carries `until`."""
    counts = {spec.edges[index].rounds for index in indices}
    stops = [index for index in indices if spec.edges[index].until is not None]
    if len(counts) > 1:
        listed = ", ".join(f"edges[{index}]: {spec.edges[index].rounds}" for index in indices)
        problems.append(_loop_problem(f"loop edges of one loop disagree on rounds ({listed}); nested loops are not "
                                      "supported", "give every loop edge of this loop the same rounds", indices[-1]))
    elif len(stops) > 1:
        problems.append(_loop_problem(
            f"loop edges {', '.join(f'edges[{index}]' for index in stops)} of one loop all carry until",
            "keep until on one loop edge: its source's output decides after each round", stops[-1], "until",
        ))
    else:
        return Loop(tuple(members), counts.pop(), tuple(indices), stops[0] if stops else None)
    return None


def _loop_problem(message: str, fix: str, edge: int, field_name: str = "rounds") -> Problem:
    """An E_LOOP problem located at a field of edge `edge`."""
    return Problem("E_LOOP", message, fix, ("edges", edge, field_name))


def unroll(
    spec: GraphSpec, nodes: Mapping[str, NodeSpec], loops: tuple[Loop, ...], loop_of: Mapping[str, int],
    implied: tuple[tuple[str, str], ...] = (),
) -> tuple[tuple[Step, ...], tuple[StepEdge, ...]]:
    """Steps in a deterministic topological order and the step edges; `implied` (producer,
    node) pairs order their steps as edges would (both outside loops: validation checks)."""
    def rounds_of(name: str) -> int | None:
        index = loop_of.get(name)
        return None if index is None else loops[index].rounds

    steps = [
        Step(name, round_number)
        for name in nodes
        for round_number in ([None] if rounds_of(name) is None else range(1, rounds_of(name) + 1))
    ]
    step_edges: list[StepEdge] = []
    for index, edge in enumerate(spec.edges):
        source_loop, target_loop = loop_of.get(edge.source), loop_of.get(edge.target)
        if edge.rounds is not None:
            step_edges += [
                StepEdge(index, Step(edge.source, r), Step(edge.target, r + 1), True) for r in range(1, edge.rounds)
            ]
        elif source_loop is not None and source_loop == target_loop:
            step_edges += [
                StepEdge(index, Step(edge.source, r), Step(edge.target, r), False)
                for r in range(1, loops[source_loop].rounds + 1)
            ]
        else:
            target = Step(edge.target, None if target_loop is None else 1)  # the first round enters it
            if source_loop is not None and loops[source_loop].until is not None:
                # a loop that may stop early is left from every round (the one it stopped at fires)
                step_edges += [StepEdge(index, Step(edge.source, r), target, False)
                               for r in range(1, loops[source_loop].rounds + 1)]
            else:
                source = Step(edge.source, rounds_of(edge.source))  # the last round leaves the loop
                step_edges.append(StepEdge(index, source, target, False))
    graph = nx.DiGraph()
    graph.add_nodes_from(steps)
    graph.add_edges_from((edge.source, edge.target) for edge in step_edges)
    graph.add_edges_from((Step(producer), Step(node)) for producer, node in implied if Step(node) in graph)
    rank = {name: position for position, name in enumerate(nodes)}
    order = tuple(nx.lexicographical_topological_sort(graph, key=lambda step: (step.round or 0, rank[step.node])))
    return order, tuple(step_edges)
