"""Subgraphs: a node that runs another topology whole (`graph:`), checked as part of its parent.

A subgraph node's topology is validated on its own first (a problem inside it names its path
under the node, `nodes[2].graph.nodes[0].prompt`, with the subgraph file's line), then where it
meets its parent:

- *entries*: the subgraph's nodes without an inbound edge of their own (and without a run-time
  foreach producer). An edge into the subgraph node delivers to each of them, in its mode: its
  text before each entry's prompt (or among an entry function's senders), its state into each
  entry's agent. So a state/full edge needs every entry to hold state on the sender's model.
- *the returned node* (`returns`, by default the subgraph's only output node): its output is
  the subgraph node's output, and an edge out of the subgraph node sends from it (its text, or
  on a state/full edge its state).
- *inputs*: each input of the subgraph is the template `inputs:` gives it (over the subgraph
  node's variables), else the value of this graph's variable of the same name, else its own
  default; a list input takes a list of templates, or `"{name}"` of a list input whole.
- *models*: a model name means one model across a topology and its subgraphs (one pool entry,
  one domain for state edges), so two different declarations under one name are refused.

Pure: the caller hands in `validate` (validate.py imports this module).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ..errors import FieldPath, PlanError, Problem
from ..spec import templates
from ..spec.models import GraphSpec, ModelSpec, NodeSpec
from .policy import ResolvedPolicy

MAX_SUBGRAPH_DEPTH = 8  # subgraphs inside subgraphs, at most (files and inline topologies alike)


@dataclass(frozen=True)
class Endpoint:
    """A node an edge meets once subgraphs are looked into: its path from the edge's graph
    (`research/answer`), its spec, and its model (None for a function node)."""

    path: str
    node: NodeSpec
    model: ModelSpec | None
    copies: bool  # whether it is a foreach node (copies of its own)


def validate_subgraphs(
    spec: GraphSpec, nodes: Mapping[str, NodeSpec], validate: Callable[..., Any], depth: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each subgraph node's validated topology (a Blueprint) and the node it returns; PlanError
    with every problem inside the subgraphs, or of how they are used, found at once."""
    children: dict[str, Any] = {}
    returns: dict[str, str] = {}
    problems: list[Problem] = []
    for index, node in enumerate(spec.nodes):
        if node.graph is None:
            continue
        where: FieldPath = ("nodes", index, "graph")
        if isinstance(node.graph, str):
            problems.append(Problem(
                "E_SUBGRAPH", f"subgraph node {node.name} names the file {node.graph!r}, which was never read: this "
                "topology was not loaded from a file", "load the topology with rclc_graph.load_graph / the CLI, or "
                "give the subgraph as a topology (a Graph or GraphSpec) instead of a path", where))
            continue
        if depth >= MAX_SUBGRAPH_DEPTH:
            problems.append(Problem("E_SUBGRAPH", f"subgraphs are nested more than {MAX_SUBGRAPH_DEPTH} deep",
                                    "flatten some subgraphs into their parents", where))
            continue
        try:
            child = validate(node.graph, depth + 1)
        except PlanError as error:
            problems += [Problem(p.code, f"in subgraph {node.name}: {p.message}", p.fix, where + tuple(p.path),
                                 p.location) for p in error.problems]
            continue
        children[node.name] = child
        returned = _returned(node, index, child, problems)
        if returned is not None:
            returns[node.name] = returned
        problems += _input_problems(spec, node, index, child)
    if problems:
        raise PlanError(problems)
    problems += _model_problems(spec, children)
    if problems:
        raise PlanError(problems)
    return children, returns


def _returned(node: NodeSpec, index: int, child: Any, problems: list[Problem]) -> str | None:
    outputs = [item.name for item in child.spec.nodes if item.output]
    if node.returns is None:
        if len(outputs) == 1:
            return outputs[0]
        problems.append(Problem(
            "E_SUBGRAPH", f"subgraph {child.spec.name} of node {node.name} has {len(outputs)} output nodes "
            f"({', '.join(outputs)}); its node's output must be one of them", f"set returns: to one of {', '.join(outputs)}",
            ("nodes", index, "returns")))
        return None
    if node.returns not in outputs:
        problems.append(Problem(
            "E_SUBGRAPH", f"returns {node.returns!r} is not an output node of subgraph {child.spec.name}",
            f"name one of its output nodes: {', '.join(outputs)} (or mark {node.returns} output: true in it)",
            ("nodes", index, "returns")))
        return None
    if child.nodes[node.returns].foreach is not None:
        problems.append(Problem(
            "E_SUBGRAPH", f"returns {node.returns!r} is a foreach node of subgraph {child.spec.name}: it has one copy "
            "per item, and a node's output is one text", "return a node after the copies that reads all of them",
            ("nodes", index, "returns")))
        return None
    return node.returns


def _input_problems(spec: GraphSpec, node: NodeSpec, index: int, child: Any) -> list[Problem]:
    """Every subgraph input gets a value of its type; `inputs:` names only the subgraph's inputs."""
    problems: list[Problem] = []
    declared = child.inputs
    parent = parent_variables(spec, node)
    for key in node.inputs:
        if key not in declared:
            close = difflib.get_close_matches(key, list(declared), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(Problem("E_SUBGRAPH", f"subgraph {child.spec.name} has no input {key!r}",
                                    f"{hint}its inputs: {', '.join(declared) or '(none)'}", ("nodes", index, "inputs", key)))
    for key, wanted in declared.items():
        path: FieldPath = ("nodes", index, "inputs", key)
        value = node.inputs.get(key)
        if value is None:
            if key in parent and parent[key] != wanted.type:
                problems.append(Problem(
                    "E_SUBGRAPH", f"subgraph input {key!r} is a {wanted.type}, but this graph's {key!r} is a "
                    f"{parent[key]}", f"map it under inputs: {key}: ...", path))
            elif key not in parent and wanted.default is None:
                problems.append(Problem(
                    "E_SUBGRAPH", f"subgraph {child.spec.name} needs input {key!r}, which node {node.name} does not give",
                    f"add inputs: {{{key}: \"{{...}}\"}} to node {node.name}, or declare an input {key!r} here", path))
        elif wanted.type == "str" and isinstance(value, list):
            problems.append(Problem("E_SUBGRAPH", f"subgraph input {key!r} is a str, but it is given a list",
                                    "give one template (a list input renders one item per line)", path))
        elif wanted.type == "list[str]" and isinstance(value, str) and list_field(value, parent) is None:
            problems.append(Problem(
                "E_SUBGRAPH", f"subgraph input {key!r} is a list[str], but it is given the text {value!r}",
                "give a list of templates, or \"{name}\" of a list[str] input to pass that list whole", path))
    return problems


def parent_variables(spec: GraphSpec, node: NodeSpec) -> dict[str, str]:
    """The variables a subgraph node can pass by name, with their types: the graph's inputs and
    the node's foreach item."""
    variables = {name: item.type for name, item in spec.input_specs().items()}
    if node.foreach is not None:
        variables[node.item] = "str"
    return variables


def list_field(template: str, variables: Mapping[str, str]) -> str | None:
    """The list variable a template passes whole ("{documents}" -> "documents"), else None."""
    fields = list(templates.fields(template))
    if len(fields) != 1 or fields[0].index is not None or f"{{{fields[0].name}}}" != template.strip():
        return None
    name = fields[0].name
    return name if variables.get(name) == "list[str]" else None


def all_models(blueprint: Any, prefix: str = "") -> Iterable[tuple[str, ModelSpec]]:
    """(where, model) for every model a topology and its subgraphs declare."""
    for model in blueprint.spec.models:
        yield prefix, model
    for name, child in blueprint.subgraphs.items():
        yield from all_models(child, f"{prefix}{name}/")


def _model_problems(spec: GraphSpec, children: Mapping[str, Any]) -> list[Problem]:
    known = {model.name: ("", model) for model in spec.models}
    problems: list[Problem] = []
    position = {node.name: index for index, node in enumerate(spec.nodes)}
    for name, child in children.items():
        for where, model in all_models(child, f"{name}/"):
            first = known.setdefault(model.name, (where, model))
            if first[1] != model:
                problems.append(Problem(
                    "E_SUBGRAPH", f"model {model.name!r} is declared twice, differently: in {first[0] or 'this graph'} "
                    f"and in subgraph {where.rstrip('/')}; one name is one model across a topology and its subgraphs",
                    "rename one of the two models (and its agents' model:), or declare them alike",
                    ("nodes", position[name], "graph")))
    return problems


# -- where edges meet subgraphs ------------------------------------------------------------------


def meets_function(
    nodes: Mapping[str, NodeSpec], subgraphs: Mapping[str, Any], returns: Mapping[str, str], name: str, *, outgoing: bool
) -> bool:
    """Whether an edge at node `name` meets a function node: the node itself, or through a
    subgraph node its returned node (`outgoing`) or any of its entry nodes, however deep."""
    node = nodes[name]
    if not node.is_subgraph:
        return node.is_function
    child = subgraphs[name]
    ends = (returns[name],) if outgoing else child.entries
    return any(meets_function(child.nodes, child.subgraphs, child.returns, end, outgoing=outgoing) for end in ends)


def endpoint(blueprint: Any, name: str) -> Endpoint:
    """A node of `blueprint` that is not a subgraph node, as an edge meets it."""
    node = blueprint.nodes[name]
    model = None if node.agent is None else blueprint.models[blueprint.agents[node.agent].model]
    return Endpoint(name, node, model, node.foreach is not None)


def senders(blueprint: Any, name: str) -> list[Endpoint]:
    """What an edge out of node `name` sends from: the node, or its subgraph's returned node."""
    if not blueprint.nodes[name].is_subgraph:
        return [endpoint(blueprint, name)]
    child = blueprint.subgraphs[name]
    return [_under(name, item) for item in senders(child, blueprint.returns[name])]


def receivers(blueprint: Any, name: str) -> list[Endpoint]:
    """What an edge into node `name` delivers to: the node, or its subgraph's entry nodes."""
    if not blueprint.nodes[name].is_subgraph:
        return [endpoint(blueprint, name)]
    child = blueprint.subgraphs[name]
    return [_under(name, item) for entry in child.entries for item in receivers(child, entry)]


def _under(name: str, item: Endpoint) -> Endpoint:
    return Endpoint(f"{name}/{item.path}", item.node, item.model, item.copies)


def boundary_problems(blueprint: Any, policies: tuple[ResolvedPolicy, ...]) -> list[Problem]:
    """Edges into and out of subgraph nodes checked against the nodes they really meet."""
    spec = blueprint.spec
    problems: list[Problem] = []
    for index, edge in enumerate(spec.edges):
        source, target = blueprint.nodes[edge.source], blueprint.nodes[edge.target]
        if not (source.is_subgraph or target.is_subgraph):
            continue
        mode = policies[index].mode
        into = receivers(blueprint, edge.target)
        if source.foreach is not None and target.is_subgraph and target.foreach != source.foreach:
            copied = [item.path for item in into if item.copies]
            if copied:
                problems.append(Problem(
                    "E_FOREACH", f"edge {edge.source} -> {edge.target} joins the copies of {edge.source} with the "
                    f"copies of {', '.join(copied)} inside the subgraph; copies pair up only over one list",
                    "route it through a node without foreach", ("edges", index)))
        if mode == "text":
            continue
        for sender in senders(blueprint, edge.source):
            for receiver in into:
                problem = _state_problem(edge.source, edge.target, mode, sender, receiver)
                if problem is not None:
                    problems.append(Problem(problem[0], problem[1], problem[2], ("edges", index, "policy")))
    return problems


def _state_problem(source: str, target: str, mode: str, sender: Endpoint, receiver: Endpoint) -> tuple[str, str, str] | None:
    """Why a state/full edge cannot go from `sender` to `receiver`, or None."""
    shown = f"a {mode} edge {source} -> {target} (from {sender.path} into {receiver.path})"
    for end in (sender, receiver):
        if end.node.is_function:
            return ("E_FUNCTION", f"{shown} touches function node {end.path}, which has no model state",
                    "use policy: {mode: text} for this edge")
        if end.model is not None and end.model.is_api:
            return ("E_API_MODEL", f"{shown} touches {end.path}, whose agent runs on an API model (text only)",
                    "use mode: text for this edge")
    if sender.model is not None and receiver.model is not None and sender.model.name != receiver.model.name:
        return ("E_CROSS_MODEL", f"{shown}: {sender.path} runs on model {sender.model.name!r}, {receiver.path} on "
                f"{receiver.model.name!r}; state only moves between agents of one model",
                "use mode: text for this edge, or give both agents the same model")
    return None
