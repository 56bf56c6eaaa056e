"""Compilation: a validated graph plus one run's inputs -> a frozen `Plan` (dag.py).

Expansion makes the concrete nodes (foreach copies `worker[0]`, loop rounds `a@2`, both
`worker[1]@3`), renders prompts and requests with the run's inputs and each node's
variables, and checks what only the inputs show (missing or mistyped inputs, indexes past
a list's end, empty lists, prompts or requests the inputs render blank, plans above
`rounds.max_nodes`). Pure: no model, no I/O.

`answers` are what people answered to interrupts (`{node: text}`), given up front or when a
waiting run is resumed: a node with `interrupt: before` reads its answer as `{answer}`, a
function node receives it as `inputs["answer"]`, and after a node with `interrupt: after`
its receivers read its output followed by the answer. Answers are not part of the plan's
fingerprint: the same run, answered later, is the same run.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..errors import PlanError, Problem
from ..spec import templates
from ..spec.models import ANSWER_VARIABLE, MAX_NODE_TEXT_BYTES, GraphSpec
from ..spec.safe_yaml import has_surrogate
from .control import DEFAULT_QUESTIONS, answer_variable
from .dag import LoopStop, Plan, PlanEdge, PlanNode, Scope
from .input_checks import DEFAULT_MAX_INPUT_BYTES, input_text_problems
from .size import expanded_size_problems
from .splice import Instance, check_total_size, entries, exits, plan_instance, spliced_edges, spliced_nodes, spliced_scopes
from .validate import Blueprint, Step, validate


def compile_plan(
    spec: GraphSpec | Blueprint,
    inputs: Mapping[str, Any],
    *,
    trust_code: bool = False,
    max_input_bytes: int | None = DEFAULT_MAX_INPUT_BYTES,
    answers: Mapping[str, str] | None = None,
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> Plan:
    """Validate (unless given a Blueprint) and expand over `inputs`; PlanError on any problem.

    `max_input_bytes` bounds the inputs' text (input_checks.py; None: no limit); `answers`: people's
    answers to interrupts, by plan node name; `functions`: callables for function nodes by their
    `call` reference (handed over in Python, so not imported)."""
    if isinstance(spec, Blueprint):
        known = {**spec.functions, **dict(functions or {})}
        if (trust_code and not spec.trust_code) or known.keys() != spec.functions.keys():
            spec = validate(spec.spec, trust_code=trust_code or spec.trust_code, functions=known)
        blueprint = spec
    else:
        blueprint = validate(spec, trust_code=trust_code, functions=functions)
    return expand(blueprint, inputs, max_input_bytes=max_input_bytes, answers=answers)


def expand(
    blueprint: Blueprint,
    inputs: Mapping[str, Any],
    *,
    max_input_bytes: int | None = DEFAULT_MAX_INPUT_BYTES,
    answers: Mapping[str, str] | None = None,
) -> Plan:
    """A validated blueprint over one run's inputs: foreach copies, loop rounds, rendered
    prompts and requests, subgraphs planned and spliced in (splice.py); PlanError (E_INPUT,
    E_INPUT_SIZE, E_TOO_LARGE, E_INTERRUPT, ...) naming every problem."""
    values = _check_inputs(blueprint, inputs)
    text_problems = input_text_problems(values, max_input_bytes)
    if text_problems:
        raise PlanError(text_problems)
    _check_indexed_fields(blueprint, values)
    copies = _copies(blueprint, values)
    size = expanded_size_problems(
        blueprint.spec, [step.node for step in blueprint.steps],
        [(edge.source.node, edge.target.node) for edge in blueprint.step_edges], copies,
    )
    if size:
        raise PlanError(size)
    layout = _Layout(blueprint, values, copies)
    given = dict(answers or {}) if isinstance(answers, Mapping) else answers
    instances = _instances(blueprint, layout, given, max_input_bytes)
    edges = _edges(blueprint, layout, instances)
    incoming: dict[str, list[int]] = {}
    outgoing: dict[str, list[int]] = {}
    for edge in edges:
        incoming.setdefault(edge.target, []).append(edge.id)
        outgoing.setdefault(edge.source, []).append(edge.id)
    own = _check_answers(blueprint, layout.names(), _own_answers(given, instances))
    nodes: list[PlanNode] = []
    for step in blueprint.steps:  # already topological; copies of one step are independent
        spec_node = blueprint.nodes[step.node]
        for index in layout.indices(step):
            name = layout.name_of(step, index)
            if name in instances:  # a subgraph instance: its own nodes, in its own order
                nodes += spliced_nodes(instances[name], incoming, outgoing, spec_node.output and _last_round(blueprint, step))
                continue
            node = _plan_node(blueprint, layout, step, index, own.get(name), incoming, outgoing)
            if node.foreach_from in instances:  # a list a subgraph writes: its returned node's output
                node = replace(node, foreach_from=instances[node.foreach_from].exit)
            nodes.append(node)
    _check_blank_texts(blueprint, nodes, edges)
    check_total_size(blueprint, nodes, edges)
    position = {node.name: index for index, node in enumerate(nodes)}
    keys = {instance.exit: name for name, instance in instances.items()}
    outputs = tuple(node.name for node in nodes if node.output)
    scopes: dict[str, Scope] = {}
    for instance in instances.values():
        scopes.update(spliced_scopes(instance))
    return Plan(
        name=blueprint.spec.name,
        spec=blueprint.spec,
        trust_code=blueprint.trust_code,
        inputs=MappingProxyType(values),
        nodes=tuple(nodes),
        edges=tuple(edges),
        outputs=outputs,
        _index=MappingProxyType(position),
        _levels=_levels(nodes, edges),
        functions=blueprint.functions,
        scopes=MappingProxyType(scopes),
        output_keys=MappingProxyType({name: keys[name] for name in outputs if name in keys}),
        entries=entries(blueprint, layout, instances),
        exits=MappingProxyType(exits(blueprint, layout, instances)),
    )


class _Layout:
    """How one blueprint's steps become plan names for one run's inputs: copies per foreach
    node, names (`worker[1]@2`) and template variables of every copy."""

    def __init__(self, blueprint: Blueprint, values: Mapping[str, Any], copies: Mapping[str, int]) -> None:
        self.blueprint, self.values, self.copies = blueprint, values, copies

    def name_of(self, step: Step, index: int | None) -> str:
        base = step.node if index is None else f"{step.node}[{index}]"
        return base if step.round is None else f"{base}@{step.round}"

    def indices(self, step: Step) -> list[int | None]:
        node = self.blueprint.nodes[step.node]
        return [None] if node.foreach is None else list(range(self.copies[step.node]))

    def names(self) -> list[str]:
        return [self.name_of(step, index) for step in self.blueprint.steps for index in self.indices(step)]

    def variables(self, step: Step, index: int | None) -> dict[str, Any]:
        return _variables(self.blueprint, self.values, step, index)


def _instances(blueprint: Blueprint, layout: _Layout, answers: Any, max_input_bytes: int | None) -> dict[str, Instance]:
    """Every subgraph instance of the plan, planned (splice.py)."""
    instances: dict[str, Instance] = {}
    nested = dict(answers) if isinstance(answers, Mapping) else {}
    for step in blueprint.steps:
        if not blueprint.nodes[step.node].is_subgraph:
            continue
        for index in layout.indices(step):
            name = layout.name_of(step, index)
            instances[name] = plan_instance(blueprint, step.node, name, layout.variables(step, index), nested,
                                            expand, max_input_bytes)
    return instances


def _own_answers(answers: Any, instances: Mapping[str, Instance]) -> Any:
    """The answers for this plan's own nodes: those addressed into a subgraph instance
    (`research/review`) went to its plan; the rest are checked here (anything not a mapping too)."""
    if not isinstance(answers, Mapping):
        return answers
    return {key: value for key, value in answers.items()
            if not (isinstance(key, str) and key.split("/", 1)[0] in instances and "/" in key)}


def _edges(blueprint: Blueprint, layout: _Layout, instances: Mapping[str, Instance]) -> list[PlanEdge]:
    """The plan's edges: its own, each from a sender to every receiver it reaches (a subgraph
    instance sends from its returned node and receives at its entries), then every instance's."""
    copies = layout.copies

    def senders(name: str) -> str:
        return instances[name].exit if name in instances else name

    def receivers(name: str) -> tuple[str, ...]:
        return instances[name].entries if name in instances else (name,)

    edges: list[PlanEdge] = []
    for step_edge in blueprint.step_edges:
        source_node, target_node = blueprint.nodes[step_edge.source.node], blueprint.nodes[step_edge.target.node]
        if source_node.foreach is not None and target_node.foreach is not None:
            pairs = [(i, i) for i in range(copies[source_node.name])]  # same list: validate checked
        else:
            pairs = [(i, j) for i in layout.indices(step_edge.source) for j in layout.indices(step_edge.target)]
        policy = blueprint.policies[step_edge.edge]
        stop = _loop_stop(blueprint, step_edge)
        if stop is not None and stop.check in instances:
            stop = replace(stop, check=senders(stop.check))
        declared = blueprint.spec.edges[step_edge.edge]
        for source_index, target_index in pairs:
            variables = layout.variables(step_edge.target, target_index)
            request = None if policy.request is None else templates.render(policy.request, variables)
            source = senders(layout.name_of(step_edge.source, source_index))
            for target in receivers(layout.name_of(step_edge.target, target_index)):
                edges.append(PlanEdge(
                    id=len(edges), source=source, target=target, declared=step_edge.edge, policy=policy,
                    request=request, loop=step_edge.loop, when=declared.when, stop=stop,
                    spec_path=("edges", step_edge.edge), routes_to=declared.target,
                ))
    for instance in instances.values():
        edges += spliced_edges(instance, len(edges))
    return edges


def _plan_node(
    blueprint: Blueprint, layout: _Layout, step: Step, index: int | None, answer: str | None,
    incoming: Mapping[str, list[int]], outgoing: Mapping[str, list[int]],
) -> PlanNode:
    """The plan node of one copy (and round) of a declared node that is not a subgraph."""
    spec_node = blueprint.nodes[step.node]
    agent = None if spec_node.agent is None else blueprint.agents[spec_node.agent]
    name = layout.name_of(step, index)
    variables = layout.variables(step, index)
    question = None
    if spec_node.question is not None:
        question = templates.render(spec_node.question, variables)
    elif spec_node.interrupt is not None:
        question = DEFAULT_QUESTIONS[spec_node.interrupt].format(node=name)  # plain text, not a template
    if answer_variable(spec_node):
        variables[ANSWER_VARIABLE] = "" if answer is None else answer  # unanswered: the node waits
    prompt, prompt_values = templates.render_spans(spec_node.prompt, variables)
    listed = spec_node.foreach_input
    return PlanNode(
        name=name,
        declared=step.node,
        agent=agent,
        model=None if agent is None else blueprint.models[agent.model],
        prompt=prompt,
        prompt_values=prompt_values,
        template=spec_node.prompt,
        generate=spec_node.generate,
        output=spec_node.output and _last_round(blueprint, step),
        index=index,
        round=step.round,
        item=None if index is None or listed is None else layout.values[listed][index],
        incoming=tuple(incoming.get(name, ())),
        outgoing=tuple(outgoing.get(name, ())),
        call=spec_node.call,
        interrupt=spec_node.interrupt,
        question=question,
        answer=answer,
        output_schema=spec_node.output_schema,
        foreach_from=spec_node.foreach_node,  # outside loops, no copies of its own: its plan name is its name
        spec_path=("nodes", _position(blueprint, step.node)),
    )


def _position(blueprint: Blueprint, name: str) -> int:
    return next(index for index, node in enumerate(blueprint.spec.nodes) if node.name == name)


def _loop_stop(blueprint: Blueprint, step_edge: Any) -> LoopStop | None:
    """How a loop that may stop early decides this edge: loop edges of such a loop go on
    while its until condition does not hold; edges leaving it from a round before the last
    fire when it held after that round. None for every other edge."""
    loop = blueprint.loop_of(step_edge.source.node)
    if loop is None or loop.until is None:
        return None
    round_number = step_edge.source.round
    leaves = blueprint.loop_of(step_edge.target.node) is not loop
    if not step_edge.loop and not leaves:
        return None  # an edge within one round
    if leaves and round_number == loop.rounds:
        return None  # the last round leaves whenever it ran
    check = f"{loop.check_node(blueprint.spec)}@{round_number}"
    return LoopStop(check=check, until=blueprint.spec.edges[loop.until].until, round=round_number, exits=leaves)


def _check_answers(blueprint: Blueprint, names: list[str], answers: Mapping[str, str] | None) -> dict[str, str]:
    """Answers by plan node: only for nodes that can take one (an interrupt, or a function,
    which may raise Interrupt), and only text."""
    if answers is None:
        return {}
    if not isinstance(answers, Mapping):
        raise PlanError([Problem("E_INTERRUPT", f"answers must be a mapping of node to text, got {type(answers).__name__}",
                                 "pass answers={'node': 'text'}", ("answers",))])
    takers = [name for name in names if _takes_answer(blueprint, name)]
    problems = []
    for key, value in answers.items():
        if key not in takers:
            known = ", ".join(takers) or "none: no node of this graph has an interrupt or is a function"
            problems.append(Problem("E_INTERRUPT", f"answer for {key!r}, which is not a node that takes an answer",
                                    f"answer one of: {known}", ("answers", str(key))))
        elif not isinstance(value, str):
            problems.append(Problem("E_INTERRUPT", f"the answer for {key!r} is a {type(value).__name__}, not text",
                                    "pass the answer as a string", ("answers", key)))
        elif len(value) * 4 > MAX_NODE_TEXT_BYTES and len(value.encode("utf-8", "surrogatepass")) > MAX_NODE_TEXT_BYTES:
            problems.append(Problem("E_INPUT_SIZE", f"the answer for {key!r} is {len(value.encode('utf-8', 'surrogatepass'))} "
                                    f"bytes, more than the {MAX_NODE_TEXT_BYTES} an answer may hold",
                                    "answer in fewer words (an answer is read like a node's output)", ("answers", key)))
        elif has_surrogate(value):  # JSON's "\ud800", or bytes of a command line that are not UTF-8
            problems.append(Problem("E_ENCODING", f"the answer for {key!r} is not valid Unicode text (it holds a lone "
                                    "surrogate: half of a UTF-16 character, or bytes that are not UTF-8)",
                                    "pass the answer as valid UTF-8 text (--answer NODE=TEXT, answers={node: text})",
                                    ("answers", key)))
    if problems:
        raise PlanError(problems)
    return dict(answers)


def _takes_answer(blueprint: Blueprint, name: str) -> bool:
    declared = name.split("[", 1)[0].split("@", 1)[0]
    node = blueprint.nodes[declared]
    return node.interrupt is not None or node.is_function  # (a subgraph's nodes take theirs as `sub/node`)


def _last_round(blueprint: Blueprint, step: Step) -> bool:
    loop = blueprint.loop_of(step.node)
    return loop is None or step.round == loop.rounds


def _variables(blueprint: Blueprint, values: Mapping[str, Any], step: Step, index: int | None) -> dict[str, Any]:
    node = blueprint.nodes[step.node]
    variables = dict(values)
    if index is not None:
        # a run-time foreach copy's item is known once its producer finished (runtime_foreach.py):
        # planned empty, rendered again then
        listed = node.foreach_input
        variables[node.item] = "" if listed is None else values[listed][index]
        variables["index"] = index
    if step.round is not None:
        variables["round"] = step.round
    return variables


def _levels(nodes: list[PlanNode], edges: list[PlanEdge]) -> tuple[tuple[str, ...], ...]:
    depth: dict[str, int] = {}
    for node in nodes:  # topological order: senders (and run-time foreach producers) come first
        before = [edges[edge].source for edge in node.incoming] + ([node.foreach_from] if node.foreach_from else [])
        depth[node.name] = 1 + max((depth[name] for name in before), default=-1)
    levels: list[list[str]] = []
    for node in nodes:
        while len(levels) <= depth[node.name]:
            levels.append([])
        levels[depth[node.name]].append(node.name)
    return tuple(tuple(level) for level in levels)


def _check_inputs(blueprint: Blueprint, inputs: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(inputs, Mapping):
        raise PlanError([Problem("E_INPUT", f"inputs must be a mapping, got {type(inputs).__name__}", "pass a dict of input values")])
    problems: list[Problem] = []
    declared = blueprint.inputs
    for key in inputs:
        if key not in declared:
            known = ", ".join(declared) or "(none declared)"
            problems.append(Problem("E_INPUT", f"unknown input {key!r}", f"declared inputs: {known}", ("inputs",)))
    values: dict[str, Any] = {}
    for key, spec in declared.items():
        value = inputs.get(key, spec.default)
        if value is None:
            problems.append(
                Problem("E_INPUT", f"input {key!r} is required", f"pass {key}, or give it a default", ("inputs", key))
            )
            continue
        if spec.type == "str":
            if not isinstance(value, str):
                problems.append(
                    Problem("E_INPUT", f"input {key!r} must be a string, got {type(value).__name__}", f"pass {key} as text", ("inputs", key))
                )
                continue
            values[key] = value
        else:
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
                problems.append(
                    Problem("E_INPUT", f"input {key!r} must be a list of strings", f"pass {key} as a list of texts", ("inputs", key))
                )
                continue
            values[key] = tuple(value)
    if problems:
        raise PlanError(problems)
    return values


def _check_indexed_fields(blueprint: Blueprint, values: Mapping[str, Any]) -> None:
    problems: list[Problem] = []
    places = [(("nodes", index, "prompt"), node.prompt) for index, node in enumerate(blueprint.spec.nodes)]
    places += [
        (("edges", index, "policy", "request"), policy.request)
        for index, policy in enumerate(blueprint.policies)
        if policy.request is not None
    ]
    for path, template in places:
        for found in templates.fields(template):
            if found.index is not None and found.name in values and found.index >= len(values[found.name]):
                problems.append(
                    Problem(
                        "E_INPUT",
                        f"{{{found}}} reads item {found.index} of input {found.name!r}, which has {len(values[found.name])} items",
                        f"pass at least {found.index + 1} items in {found.name}",
                        path,
                    )
                )
    if problems:
        raise PlanError(problems)


def _check_blank_texts(blueprint: Blueprint, nodes: list[PlanNode], edges: list[PlanEdge]) -> None:
    """Refuse prompts and selection requests that the inputs render empty.

    Empty inputs pass the type checks (a string is a string), but a node without senders
    whose prompt renders to blanks has nothing to read, and a selection request that is
    blank has nothing to condition on: both would fail inside the model work, after earlier
    nodes already ran. Caught here, the error names the field and the inputs to fill in."""
    by_name = {node.name: node for node in nodes}
    problems: list[Problem] = []
    reported: set[tuple[str | int, ...]] = set()

    def refuse(path: tuple[str | int, ...], what: str, template: str) -> None:
        if path in reported:
            return
        reported.add(path)
        used = sorted({found.name for found in templates.fields(template)} & set(blueprint.inputs))
        problems.append(Problem(
            "E_INPUT",
            f"{what} is empty for these inputs" + (f" (it reads {', '.join(used)})" if used else ""),
            f"pass non-empty text in {', '.join(used)}" if used else "write some text into the template",
            path,
        ))

    for node in nodes:
        if node.is_function or (node.interrupt == "before" and node.answer is None):
            continue  # a function has no prompt; an unanswered prompt is rendered once answered
        if node.scope or node.foreach_from is not None:
            continue  # a subgraph's plan checked its own; a run-time copy's item is read when it runs
        if not node.incoming and not node.prompt.strip():
            refuse(node.spec_path + ("prompt",), f"the prompt of node {node.name!r}", node.template)
    for edge in edges:
        target = by_name[edge.target]
        if edge.policy.mode == "text" or len(edge.spec_path) > 2 or target.foreach_from is not None:
            continue  # (text needs no request; a subgraph's own edges were checked in its plan)
        if edge.request is not None:
            if not edge.request.strip():
                refuse(edge.spec_path + ("policy", "request"), f"the selection request of edge {edge.source!r} -> "
                       f"{edge.target!r}", edge.policy.request or "")
        elif not target.prompt.strip() and not any(edges[other].policy.mode == "text" for other in target.incoming):
            refuse(target.spec_path + ("prompt",),
                   f"the prompt of node {target.name!r} (the selection request of its state edges)", target.template)
    if problems:
        raise PlanError(problems)


def _copies(blueprint: Blueprint, values: Mapping[str, Any]) -> dict[str, int]:
    copies: dict[str, int] = {}
    problems: list[Problem] = []
    for index, node in enumerate(blueprint.spec.nodes):
        if node.foreach is None:
            copies[node.name] = 1
            continue
        if node.foreach_input is None:  # over a node's run-time list: as many copies as it may hold
            copies[node.name] = node.foreach.max_items  # type: ignore[union-attr]
            continue
        copies[node.name] = len(values[node.foreach_input])
        if copies[node.name] == 0:
            problems.append(
                Problem(
                    "E_INPUT",
                    f"input {node.foreach_input!r} is empty, so node {node.name} would have no copies",
                    f"pass at least one item in {node.foreach_input}",
                    ("nodes", index, "foreach"),
                )
            )
    if problems:
        raise PlanError(problems)
    return copies
