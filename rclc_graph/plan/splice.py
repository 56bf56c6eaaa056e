"""Subgraph instances in a plan: a subgraph node's topology, planned over its own inputs and
spliced into the parent's plan under the instance's name.

Each copy or round of a subgraph node is one *instance* (`research`, `research[1]`,
`research@2`). Its topology is expanded over the inputs the node gives it (subgraphs.py says
how they map), and its plan nodes join the parent's as `instance/name`, its edges with them
(renumbered after the parent's). An edge into the instance reaches the subgraph's entry
nodes; an edge out of it leaves from the subgraph's returned node. A plan spliced this way
is an ordinary plan: the scheduler, executors, records and resume need nothing else, and a
node's `scope` and the plan's `scopes` say which instance each node belongs to.

Pure, like compile.py (which hands in its `expand`, as it imports this module).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..errors import FieldPath, PlanError, Problem
from ..spec import templates
from ..spec.models import NodeSpec
from .dag import LoopStop, Plan, PlanEdge, PlanNode, Scope
from .loops import Step
from .size import max_edges
from .subgraphs import list_field, parent_variables


@dataclass(frozen=True)
class Instance:
    """One planned subgraph instance, before it is spliced: its name, its plan, where its
    subgraph node is written, and the node its parent reads as the instance's output."""

    name: str
    declared: str  # the subgraph node's name in the parent
    plan: Plan
    spec_path: FieldPath
    returns: str  # the returned node's name inside `plan`

    @property
    def exit(self) -> str:
        """The plan node (parent's naming) an edge out of the instance sends from."""
        return f"{self.name}/{self.returns}"

    @property
    def entries(self) -> tuple[str, ...]:
        """The plan nodes (parent's naming) an edge into the instance delivers to."""
        return tuple(f"{self.name}/{entry}" for entry in self.plan.entries)


def subgraph_inputs(spec: Any, node: NodeSpec, child: Any, variables: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs instance `variables` give the subgraph of `node` (see subgraphs.py): mapped
    templates rendered, lists passed whole, same-named variables passed on; the rest is left to
    the subgraph's defaults."""
    values: dict[str, Any] = {}
    names = parent_variables(spec, node)
    for key, wanted in child.inputs.items():
        given = node.inputs.get(key)
        if given is None:
            if key in names:
                values[key] = variables[key]
        elif isinstance(given, list):
            values[key] = [templates.render(template, variables) for template in given]
        elif wanted.type == "list[str]":
            values[key] = list(variables[list_field(given, names) or ""])
        else:
            values[key] = templates.render(given, variables)
    return values


def plan_instance(
    blueprint: Any,
    step_node: str,
    name: str,
    variables: Mapping[str, Any],
    answers: Mapping[str, str],
    expand: Callable[..., Plan],
    max_input_bytes: int | None,
) -> Instance:
    """Instance `name` of subgraph node `step_node`: its plan over the inputs it is given and
    the answers addressed to its nodes (`name/node`); PlanError with every problem placed
    under the subgraph node."""
    node = blueprint.nodes[step_node]
    index = next(position for position, item in enumerate(blueprint.spec.nodes) if item.name == step_node)
    child = blueprint.subgraphs[step_node]
    own = {key[len(name) + 1:]: value for key, value in answers.items() if key.startswith(f"{name}/")}
    try:
        plan = expand(child, subgraph_inputs(blueprint.spec, node, child, variables),
                      max_input_bytes=max_input_bytes, answers=own)
    except PlanError as error:
        raise PlanError([_placed(problem, index, name) for problem in error.problems]) from None
    return Instance(name, step_node, plan, ("nodes", index), plan.exits[blueprint.returns[step_node]])


def _placed(problem: Problem, index: int, name: str) -> Problem:
    """A problem of an instance's plan, placed where its parent writes the subgraph node."""
    path = tuple(problem.path)
    if path[:1] == ("answers",):
        path = ("answers", f"{name}/{path[1]}") + path[2:] if len(path) > 1 else path
    elif path[:1] == ("inputs",):
        path = ("nodes", index, "inputs") + path[1:]
    else:
        path = ("nodes", index, "graph") + path
    return Problem(problem.code, f"in subgraph {name}: {problem.message}", problem.fix, path, problem.location)


def spliced_edges(instance: Instance, offset: int) -> list[PlanEdge]:
    """The instance's own edges under their parent names, numbered from `offset`."""
    prefix = f"{instance.name}/"
    return [
        replace(
            edge,
            id=offset + edge.id,
            source=prefix + edge.source,
            target=prefix + edge.target,
            stop=None if edge.stop is None else _renamed_stop(edge.stop, prefix),
            spec_path=instance.spec_path + ("graph",) + tuple(edge.spec_path),
        )
        for edge in instance.plan.edges
    ]


def _renamed_stop(stop: LoopStop, prefix: str) -> LoopStop:
    return replace(stop, check=prefix + stop.check)


def spliced_nodes(
    instance: Instance, incoming: Mapping[str, list[int]], outgoing: Mapping[str, list[int]], answers_output: bool
) -> list[PlanNode]:
    """The instance's nodes under their parent names, wired to the parent plan's edge ids; the
    returned node is an output of the parent when the subgraph node is (`answers_output`)."""
    prefix = f"{instance.name}/"
    nodes = []
    for node in instance.plan.nodes:
        name = prefix + node.name
        nodes.append(replace(
            node,
            name=name,
            declared=f"{instance.declared}/{node.declared}",
            output=answers_output and node.name == instance.returns,
            incoming=tuple(incoming.get(name, ())),
            outgoing=tuple(outgoing.get(name, ())),
            scope=instance.name if not node.scope else prefix + node.scope,
            foreach_from=None if node.foreach_from is None else prefix + node.foreach_from,
            spec_path=instance.spec_path + ("graph",) + tuple(node.spec_path),
        ))
    return nodes


def spliced_scopes(instance: Instance) -> dict[str, Scope]:
    """The instance itself and the instances nested in it, as scopes of the parent plan."""
    prefix = f"{instance.name}/"
    plan = instance.plan
    scopes = {instance.name: Scope(
        name=instance.name, node=instance.declared, graph=plan.name, inputs=plan.inputs, returns=instance.exit,
        entries=instance.entries, spec_path=instance.spec_path,
    )}
    for scope in plan.scopes.values():
        scopes[prefix + scope.name] = replace(
            scope, name=prefix + scope.name, node=f"{instance.declared}/{scope.node}", returns=prefix + scope.returns,
            entries=tuple(prefix + entry for entry in scope.entries),
            spec_path=instance.spec_path + ("graph",) + tuple(scope.spec_path),
        )
    return scopes


# -- a plan as a subgraph: where edges attach, and its size with its subgraphs -------------------


def entries(blueprint: Any, layout: Any, instances: Mapping[str, Instance]) -> tuple[str, ...]:
    """Where an edge into this plan (as a subgraph) delivers: every copy of each entry node,
    an entry subgraph's own entries (entries sit outside loops: a loop node has an inbound edge)."""
    found: list[str] = []
    for entry in blueprint.entries:
        for index in layout.indices(Step(entry)):
            name = layout.name_of(Step(entry), index)
            found += instances[name].entries if name in instances else [name]
    return tuple(found)


def exits(blueprint: Any, layout: Any, instances: Mapping[str, Instance]) -> dict[str, str]:
    """Declared output node (without copies) -> the plan node its output comes from (its last
    round; a subgraph's returned node)."""
    exits: dict[str, str] = {}
    for node in blueprint.spec.nodes:
        if not node.output or node.foreach is not None:
            continue
        loop = blueprint.loop_of(node.name)
        name = layout.name_of(Step(node.name, None if loop is None else loop.rounds), None)
        exits[node.name] = instances[name].exit if name in instances else name
    return exits


def check_total_size(blueprint: Any, nodes: list[PlanNode], edges: list[PlanEdge]) -> None:
    """With subgraphs spliced in, the plan must still fit the graph's guards."""
    limit = blueprint.spec.rounds.max_nodes
    fix = "use fewer subgraph copies, or raise rounds.max_nodes (up to its cap)"
    problems = []
    if len(nodes) > limit:
        problems.append(Problem("E_TOO_LARGE", f"the plan would hold {len(nodes)} nodes with its subgraphs, more "
                                f"than the {limit} allowed (rounds.max_nodes)", fix, ("rounds", "max_nodes")))
    if len(edges) > max_edges(blueprint.spec):
        problems.append(Problem("E_TOO_LARGE", f"the plan would hold {len(edges)} edges with its subgraphs, more "
                                f"than the {max_edges(blueprint.spec)} allowed", fix, ("rounds", "max_nodes")))
    if problems:
        raise PlanError(problems)
