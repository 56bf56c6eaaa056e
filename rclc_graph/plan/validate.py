"""Whole-graph validation: references, policies, loops, reachability and templates.

`validate(spec)` needs no run inputs and returns a `Blueprint`: the checked graph with its
loops unrolled into "steps" (a declared node in one round). A `Plan` is a blueprint expanded
over one run's inputs (foreach copies), see `compile.py` (which builds dag.py's `Plan`); loop semantics are in `loops.py`.
Everything here is pure: no model, no torch, no I/O.

Checks run in phases (names and references, then policies and models, then loops, then
templates, then flow); each phase reports all its problems at once, and a later phase only
runs when the earlier ones passed, since it relies on their results.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import networkx as nx

from ..errors import FieldPath, PlanError, Problem
from ..spec import templates
from ..spec.models import ANSWER_VARIABLE, AgentSpec, GraphSpec, InputSpec, ModelSpec, NodeSpec, TransferPolicy
from .agent_features import api_edge, check_agent_features
from .spec_index import SpecIndex
from .control import answer_variable, check_control
from .loops import Loop, Step, StepEdge, find_loops, unroll
from .policy import ResolvedPolicy, resolve_policy
from .option_checks import option_problems
from .runtime_foreach import dependencies, foreach_problems
from .size import unrolled_size_problems
from .subgraphs import boundary_problems, list_field, meets_function, parent_variables, validate_subgraphs
from .text_checks import text_problems


@dataclass(frozen=True)
class Blueprint:
    """A validated graph, independent of run inputs."""

    spec: GraphSpec
    trust_code: bool
    models: Mapping[str, ModelSpec]
    agents: Mapping[str, AgentSpec]
    nodes: Mapping[str, NodeSpec]
    inputs: Mapping[str, InputSpec]
    policies: tuple[ResolvedPolicy, ...]  # one per spec edge
    loops: tuple[Loop, ...]
    steps: tuple[Step, ...]  # deterministic topological order
    step_edges: tuple[StepEdge, ...]  # (declared edge, round) order
    _loop_of: Mapping[str, int] = field(repr=False, compare=False, default_factory=dict)
    # callables the builder was handed for function nodes, by their `call` reference (not imported)
    functions: Mapping[str, Callable[..., Any]] = field(repr=False, compare=False, default_factory=dict)
    # subgraph nodes: each one's validated topology, and the node of it whose output is the node's (subgraphs.py)
    subgraphs: Mapping[str, Blueprint] = field(default_factory=dict)
    returns: Mapping[str, str] = field(default_factory=dict)
    # (producer, node) of every run-time foreach: the node's copies wait for the producer (runtime_foreach.py)
    dependencies: tuple[tuple[str, str], ...] = ()

    @property
    def entries(self) -> tuple[str, ...]:
        """The nodes an edge into this graph reaches when it runs as a subgraph: those without an
        inbound edge or a run-time foreach producer, in declaration order."""
        targets = {edge.target for edge in self.spec.edges} | {node for _, node in self.dependencies}
        return tuple(name for name in self.nodes if name not in targets)

    def loop_of(self, node: str) -> Loop | None:
        """The bounded loop `node` belongs to, or None."""
        index = self._loop_of.get(node)
        return None if index is None else self.loops[index]

    def variables(self, node: str) -> frozenset[str]:
        """Template variables a node may use: inputs, its foreach item and index, and round."""
        spec = self.nodes[node]
        names = set(self.inputs)
        if spec.foreach is not None:  # over an input or a node's run-time list: item and index alike
            names |= {spec.item, "index"}
        if node in self._loop_of:
            names.add("round")
        if answer_variable(spec):
            names.add(ANSWER_VARIABLE)
        return frozenset(names)


def validate(
    spec: GraphSpec,
    *,
    trust_code: bool = False,
    functions: Mapping[str, Callable[..., Any]] | None = None,
    _depth: int = 0,
) -> Blueprint:
    """Check `spec` as a whole; raise PlanError listing every problem of the first failing phase.

    `functions` maps function nodes' `call` references to callables handed over in Python
    (the builder's `Graph.function`): those are not imported, so they need no trust_code.
    Subgraphs (`graph:` nodes) are validated first, each as a topology of its own
    (`_depth`: how deep this one is nested)."""
    functions = MappingProxyType(dict(functions or {}))
    _raise(_check_names(spec))
    models = {model.name: model for model in spec.models}
    agents = {agent.name: agent for agent in spec.agents}
    nodes = {node.name: node for node in spec.nodes}
    inputs = spec.input_specs()

    def validate_child(child: GraphSpec, depth: int) -> Blueprint:
        return validate(child, trust_code=trust_code, functions=functions, _depth=depth)

    subgraphs, returns = validate_subgraphs(spec, nodes, validate_child, _depth)
    policies = tuple(_edge_policy(spec, index, nodes, subgraphs, returns) for index in range(len(spec.edges)))
    index = SpecIndex(spec, models, agents, nodes, policies, trust_code)
    implied = dependencies(spec)
    _raise(
        _check_policies(index)
        + check_agent_features(index)
        + option_problems(spec)
        + text_problems(spec)
    )
    loops, loop_of = find_loops(spec, nodes, implied)
    _raise(unrolled_size_problems(spec, nodes, loops, loop_of))  # arithmetic first: never unroll a huge plan
    _raise(check_control(spec, nodes, inputs, policies, loops, loop_of, trust_code=trust_code, functions=functions)
           + foreach_problems(spec, nodes, loop_of))
    steps, step_edges = unroll(spec, nodes, loops, loop_of, implied)
    blueprint = Blueprint(
        spec=spec,
        trust_code=trust_code,
        models=MappingProxyType(models),
        agents=MappingProxyType(agents),
        nodes=MappingProxyType(nodes),
        inputs=MappingProxyType(inputs),
        policies=policies,
        loops=loops,
        steps=steps,
        step_edges=step_edges,
        _loop_of=MappingProxyType(loop_of),
        functions=functions,
        subgraphs=MappingProxyType(subgraphs),
        returns=MappingProxyType(returns),
        dependencies=implied,
    )
    _raise(boundary_problems(blueprint, policies))
    _raise(_check_templates(blueprint))
    _raise(_check_flow(blueprint))
    return blueprint


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise PlanError(problems)


def _suggest(name: str, known: Iterable[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"known: {', '.join(known)}" if known else "declare it first"


def _check_names(spec: GraphSpec) -> list[Problem]:
    problems: list[Problem] = []
    for kind, items in (("models", spec.models), ("agents", spec.agents), ("nodes", spec.nodes)):
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            if item.name in seen:
                problems.append(
                    Problem(
                        "E_DUPLICATE_NAME",
                        f"{kind[:-1]} {item.name!r} is declared twice (first as {kind}[{seen[item.name]}])",
                        "rename or remove one of them",
                        (kind, index, "name"),
                    )
                )
            seen.setdefault(item.name, index)
    models = {model.name for model in spec.models}
    agents = {agent.name for agent in spec.agents}
    nodes = {node.name for node in spec.nodes}
    inputs = spec.input_specs()
    for index, agent in enumerate(spec.agents):
        if agent.model not in models:
            problems.append(_unknown("model", agent.model, models, ("agents", index, "model")))
    for index, node in enumerate(spec.nodes):
        if node.agent is not None and node.agent not in agents:
            problems.append(_unknown("agent", node.agent, agents, ("nodes", index, "agent")))
        if node.foreach_node is not None and node.foreach_node not in nodes:
            problems.append(_unknown("node", node.foreach_node, nodes, ("nodes", index, "foreach", "node")))
        if node.foreach is not None:
            listed = node.foreach_input
            if listed is not None and listed not in inputs:
                problems.append(_unknown("input", listed, inputs, ("nodes", index, "foreach")))
            elif listed is not None and inputs[listed].type != "list[str]":
                problems.append(
                    Problem(
                        "E_FOREACH",
                        f"foreach input {listed!r} is a str, not a list",
                        f"declare {listed} with type: list[str]",
                        ("nodes", index, "foreach"),
                    )
                )
            if node.item in inputs:
                problems.append(
                    Problem(
                        "E_FOREACH",
                        f"item variable {node.item!r} hides the input of the same name",
                        "choose another item name",
                        ("nodes", index, "item"),
                    )
                )
    pairs: dict[tuple[str, str], int] = {}
    for index, edge in enumerate(spec.edges):
        for end in ("source", "target"):
            name = getattr(edge, end)
            if name not in nodes:
                problems.append(_unknown("node", name, nodes, ("edges", index, end)))
        if isinstance(edge.policy, str) and edge.policy not in spec.policies:
            problems.append(_unknown("policy", edge.policy, spec.policies, ("edges", index, "policy")))
        key = (edge.source, edge.target)
        if key in pairs:
            problems.append(
                Problem(
                    "E_DUPLICATE_NAME",
                    f"edge {edge.source} -> {edge.target} is declared twice (first as edges[{pairs[key]}])",
                    "keep one edge per sender and receiver",
                    ("edges", index),
                )
            )
        pairs.setdefault(key, index)
    return problems


def _unknown(kind: str, name: str, known: Iterable[str], path: FieldPath) -> Problem:
    return Problem("E_UNKNOWN_REF", f"unknown {kind} {name!r}", _suggest(name, known), path)


def _edge_policy(
    spec: GraphSpec,
    index: int,
    nodes: Mapping[str, NodeSpec],
    subgraphs: Mapping[str, Blueprint],
    returns: Mapping[str, str],
) -> ResolvedPolicy:
    """The edge's policy with every default filled in. An edge without `policy:` carries text
    when either end meets a function node (it has no model state), else the default state
    policy. Through a subgraph node the end it meets is the subgraph's returned node (edges
    out) or its entry nodes (edges in), so a plain edge into a subgraph that starts with a
    function node carries text as it would into that function node itself."""
    edge = spec.edges[index]
    policy = edge.policy
    if policy is None:
        functional = meets_function(nodes, subgraphs, returns, edge.source, outgoing=True) or meets_function(
            nodes, subgraphs, returns, edge.target, outgoing=False)
        return resolve_policy(TransferPolicy(mode="text" if functional else "state"))
    if isinstance(policy, TransferPolicy):
        return resolve_policy(policy)
    return resolve_policy(spec.policies[policy], name=policy)


def _check_policies(index: SpecIndex) -> list[Problem]:
    spec, models, agents, nodes = index.spec, index.models, index.agents, index.nodes
    policies, trust_code = index.policies, index.trust_code
    problems: list[Problem] = []
    if not trust_code:
        checked: list[tuple[FieldPath, ResolvedPolicy]] = [
            (("policies", name), resolve_policy(policy)) for name, policy in spec.policies.items()
        ]
        checked += [
            (("edges", index, "policy"), policy)
            for index, policy in enumerate(policies)
            if isinstance(spec.edges[index].policy, TransferPolicy)
        ]
        for path, policy in checked:
            for field_name, reference in policy.user_code():
                what, field_path = f"{field_name} {reference!r}", path + tuple(field_name.split("."))
                problems.append(Problem.untrusted_code(what, field_path, instead="use a built-in"))
    for index, edge in enumerate(spec.edges):
        policy = policies[index]
        source, target = nodes[edge.source], nodes[edge.target]
        source_model = None if source.agent is None else agents[source.agent].model
        target_model = None if target.agent is None else agents[target.agent].model
        # control.py refuses a function's non-text edges; subgraphs.py checks the nodes a subgraph's edge meets
        functions = any(end.is_function or end.is_subgraph for end in (source, target))
        if (
            policy.mode != "text"
            and source_model != target_model
            and not functions
            and not api_edge(spec, models, agents, nodes, index)
        ):
            problems.append(
                Problem(
                    "E_CROSS_MODEL",
                    f"a {policy.mode} edge from {edge.source} (model {source_model!r}) to {edge.target} "
                    f"(model {target_model!r}): state only moves between agents of one model",
                    "use mode: text for this edge, or give both agents the same model",
                    ("edges", index),
                )
            )
        if source.foreach is not None and target.foreach is not None and source.foreach != target.foreach:
            problems.append(
                Problem(
                    "E_FOREACH",
                    f"edge {edge.source} -> {edge.target} joins copies over {_list_name(source)} and "
                    f"{_list_name(target)}; "
                    "copies pair up only over the same list",
                    "route it through a node without foreach, or iterate both nodes over the same input",
                    ("edges", index),
                )
            )
        if policy.mode == "text" and not source.generate:
            problems.append(
                Problem(
                    "E_GENERATE",
                    f"a text edge from {edge.source}, which has generate: false and so writes no text",
                    f"set generate: true on {edge.source}, or use mode: state",
                    ("edges", index),
                )
            )
    for index, node in enumerate(spec.nodes):
        if node.output and not node.generate:
            problems.append(
                Problem(
                    "E_GENERATE",
                    f"output node {node.name} has generate: false, so it produces no answer",
                    "set generate: true, or output: false",
                    ("nodes", index, "generate"),
                )
            )
    return problems


def _list_name(node: NodeSpec) -> str:
    if node.foreach_node is not None:
        return f"the run-time list of {node.foreach_node!r} (max_items {node.foreach.max_items})"  # type: ignore[union-attr]
    return repr(node.foreach)


def _check_templates(blueprint: Blueprint) -> list[Problem]:
    problems: list[Problem] = []
    spec = blueprint.spec
    for index, node in enumerate(spec.nodes):
        problems += _template_problems(blueprint, node.name, node.prompt, ("nodes", index, "prompt"))
        for key, value in node.inputs.items():  # a subgraph's inputs: templates over this node's variables
            if isinstance(value, str) and list_field(value, parent_variables(spec, node)) is not None:
                continue  # "{documents}" passes the list whole
            for position, template in enumerate([value] if isinstance(value, str) else value):
                path: FieldPath = ("nodes", index, "inputs", key) + (() if isinstance(value, str) else (position,))
                problems += _template_problems(blueprint, node.name, template, path)
        if node.question is not None:
            problems += _template_problems(blueprint, node.name, node.question, ("nodes", index, "question"))
    for index, edge in enumerate(spec.edges):
        request = blueprint.policies[index].request
        if request is None:
            continue
        if isinstance(edge.policy, str):
            path: FieldPath = ("policies", edge.policy, "request")
        else:
            path = ("edges", index, "policy", "request")
        problems += _template_problems(blueprint, edge.target, request, path, f"edges[{index}] -> {edge.target}")
    return problems


def _template_problems(blueprint: Blueprint, node: str, template: str, path: FieldPath, where: str = "") -> list[Problem]:
    allowed = blueprint.variables(node)
    problems = []
    for found in templates.fields(template):
        suffix = f" ({where})" if where else ""
        if found.name not in allowed:
            problems.append(
                Problem(
                    "E_TEMPLATE",
                    f"template field {{{found}}} is not an input or a variable of node {node}{suffix}",
                    f"declare it under inputs, or use one of: {', '.join(sorted(allowed)) or '(none)'}",
                    path,
                )
            )
        elif found.index is not None and (found.name not in blueprint.inputs or blueprint.inputs[found.name].type != "list[str]"):
            problems.append(
                Problem(
                    "E_TEMPLATE",
                    f"template field {{{found}}} indexes {found.name}, which is not a list input{suffix}",
                    f"write {{{found.name}}}",
                    path,
                )
            )
    return problems


def _check_flow(blueprint: Blueprint) -> list[Problem]:
    spec = blueprint.spec
    outputs = [node.name for node in spec.nodes if node.output]
    if not outputs:
        return [Problem("E_NO_OUTPUT", "no node is marked output: true", "set output: true on the answer node(s)", ("nodes",))]
    graph = nx.DiGraph()
    graph.add_nodes_from(blueprint.steps)
    graph.add_edges_from((edge.source, edge.target) for edge in blueprint.step_edges)
    graph.add_edges_from((Step(producer), Step(node)) for producer, node in blueprint.dependencies)  # outside loops
    final = {step for step in blueprint.steps if step.node in outputs and _is_last_round(blueprint, step)}
    useful: set[Step] = set(final)
    for step in final:
        useful |= nx.ancestors(graph, step)
    position = {node.name: index for index, node in enumerate(spec.nodes)}
    problems: list[Problem] = []
    for step in blueprint.steps:
        if step not in useful:
            loop = blueprint.loop_of(step.node)
            which = f" (round {step.round} of {loop.rounds})" if loop is not None else ""
            problems.append(
                Problem(
                    "E_UNREACHABLE",
                    f"node {step.node}{which} does not lead to any output node, so its work is lost",
                    "add an edge from it toward an output node, mark it output: true, or remove it",
                    ("nodes", position[step.node]),
                )
            )
    reported = set()
    for step in blueprint.steps:
        if graph.in_degree(step) or step.node in reported:
            continue
        node = blueprint.nodes[step.node]
        if node.is_function or node.is_subgraph:
            continue  # a function receives every input; a subgraph's own nodes read its inputs
        reads = {found.name for found in templates.fields(node.prompt)}
        readable = set(blueprint.inputs) | ({node.item} if node.foreach else set())
        if answer_variable(node):
            readable.add(ANSWER_VARIABLE)
        if not reads & readable:
            reported.add(step.node)
            which = f" in round {step.round}" if step.round is not None else ""
            problems.append(
                Problem(
                    "E_NO_PROMPT",
                    f"node {step.node} has no senders{which} and its prompt reads no input",
                    "use an input in its prompt (e.g. {question}), or add an edge into it",
                    ("nodes", position[step.node], "prompt"),
                )
            )
    return problems


def _is_last_round(blueprint: Blueprint, step: Step) -> bool:
    loop = blueprint.loop_of(step.node)
    return loop is None or step.round == loop.rounds
