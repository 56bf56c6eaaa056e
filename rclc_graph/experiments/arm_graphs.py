"""The graph each arm runs: a topology with the arm's policy on every edge, or a reference graph.

`apply_arm` is pure: it returns a new spec in which every edge carries the arm's policy (each
edge keeps its own `request` template, which says what its receiver needs) or, for the two
reference arms, a one-node graph around the output node's agent. `validate_arms` validates
every arm's graph before any model work; `spec_fingerprint` names a graph in result rows.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

from ..errors import GraphError, PlanError, Problem
from ..plan.validate import Blueprint, validate
from ..spec import templates
from ..spec.models import GraphSpec
from .arms import Arm
from .inputs import InputMapping, resolve_mapping


def apply_arm(spec: GraphSpec, arm: Arm, *, mapping: InputMapping | None = None) -> GraphSpec:
    """The topology as this arm runs it (pure: `spec` is not changed).

    Policy arms: every edge gets the arm's policy with the edge's own `request`; named
    policies are dropped (no edge refers to them any more). A text arm also turns generation
    on for every sender (a sender must write the report its receiver reads) and, with
    `max_new_tokens`, caps those reports. Reference arms: a one-node graph running the output
    node's agent on the question alone (question_only) or on all documents followed by the
    output node's prompt (single_context). The result is not validated here; see
    `validate_arms`.
    """
    if arm.kind != "policy":
        return _reference_graph(spec, arm, mapping or resolve_mapping(spec))
    assert arm.policy is not None
    data = spec.model_dump(mode="json", exclude_none=True)
    base = arm.policy.model_dump(mode="json", exclude_none=True)
    edges = []
    for edge in data["edges"]:
        current = edge.get("policy", {})
        if isinstance(current, str):
            current = data["policies"].get(current, {})  # an unknown name: validation reports it
        policy = dict(base)
        request = current.get("request") if isinstance(current, dict) else None
        if request is not None and arm.policy.mode != "text":
            policy["request"] = request
        edges.append({**edge, "policy": policy})
    data["edges"] = edges
    data["policies"] = {}
    if arm.policy.mode == "text":
        senders = {edge["source"] for edge in edges}
        for node in data["nodes"]:
            if node["name"] in senders:
                node["generate"] = True
        if arm.max_new_tokens is not None:
            _cap_reports(data, senders, arm.max_new_tokens)
    return GraphSpec.model_validate(data)


def _cap_reports(data: dict[str, Any], senders: set[str], max_new_tokens: int) -> None:
    """Give sender nodes agents whose reports stop at `max_new_tokens`; an agent also used by
    a non-sender (e.g. the answering node) is copied, so the answer's own cap is unchanged."""
    agents = {agent["name"]: agent for agent in data["agents"]}
    used_elsewhere = {node["agent"] for node in data["nodes"] if node["name"] not in senders}
    names = set(agents)
    renamed: dict[str, str] = {}
    for node in data["nodes"]:
        if node["name"] not in senders or node["agent"] not in agents:
            continue
        agent_name = node["agent"]
        if agent_name in used_elsewhere:
            if agent_name not in renamed:
                copy_name = f"{agent_name}_report"
                while copy_name in names:
                    copy_name += "_"
                names.add(copy_name)
                renamed[agent_name] = copy_name
                data["agents"].append({**agents[agent_name], "name": copy_name, "max_new_tokens": max_new_tokens})
            node["agent"] = renamed[agent_name]
        else:
            agents[agent_name]["max_new_tokens"] = max_new_tokens


def _reference_graph(spec: GraphSpec, arm: Arm, mapping: InputMapping) -> GraphSpec:
    outputs = [node for node in spec.nodes if node.output]
    if len(outputs) != 1:
        raise PlanError([Problem("E_NO_OUTPUT", f"arm {arm.name!r} ({arm.kind}) needs exactly one output node, found {len(outputs)}",
                                 "mark one node output: true", ("nodes",))])
    output = outputs[0]
    if output.foreach is not None:
        raise PlanError([Problem("E_FOREACH", f"arm {arm.name!r} ({arm.kind}): the output node {output.name} is a foreach node",
                                 "use a topology whose answering node is a single node", ("nodes",))])
    agent = next((agent for agent in spec.agents if agent.name == output.agent), None)
    if agent is None:
        raise PlanError([Problem("E_UNKNOWN_REF", f"unknown agent {output.agent!r} of output node {output.name}", "declare it", ("nodes",))])
    model = next((model for model in spec.models if model.name == agent.model), None)
    reads = {found.name for found in templates.fields(output.prompt)}
    prompt = output.prompt
    if mapping.question not in reads:
        prompt = f"Question: {{{mapping.question}}}\n{prompt}"
    if arm.kind == "question_only":
        if mapping.documents in reads:
            raise PlanError([Problem("E_TEMPLATE", f"arm {arm.name!r} (question_only): the output node's prompt reads "
                                     f"{{{mapping.documents}}}, so it cannot answer from the question alone",
                                     "drop the question_only arm for this topology", ("nodes",))])
    elif mapping.documents not in reads:
        prompt = f"{{{mapping.documents}}}\n\n{prompt}"
    node = output.model_dump(mode="json", exclude_none=True)
    node.update(prompt=prompt, generate=True, output=True)
    data = {
        "version": spec.version,
        "name": spec.name,
        "description": f"{spec.name}: {arm.kind} reference with agent {agent.name}",
        "inputs": {name: value.model_dump(mode="json", exclude_none=True) for name, value in spec.input_specs().items()},
        "models": [model.model_dump(mode="json", exclude_none=True)] if model is not None else [],
        "agents": [agent.model_dump(mode="json", exclude_none=True)],
        "nodes": [node],
        "rounds": spec.rounds.model_dump(mode="json"),
    }
    return GraphSpec.model_validate(data)


def validate_arms(
    spec: GraphSpec, arms: Iterable[Arm], *, mapping: InputMapping | None = None, trust_code: bool = False
) -> dict[str, Blueprint]:
    """{arm name: validated Blueprint of the arm's graph}; PlanError naming the arm otherwise.

    Runs before any model work, so a bad arm (a text arm over a sender that cannot generate,
    a user selector without trust_code, ...) costs nothing.
    """
    mapping = mapping or resolve_mapping(spec)
    blueprints = {}
    problems: list[Problem] = []
    for arm in arms:
        try:
            arm_spec = apply_arm(spec, arm, mapping=mapping)
            blueprint = validate(arm_spec, trust_code=trust_code)
        except GraphError as exc:
            problems += [Problem(p.code, f"arm {arm.name!r}: {p.message}", p.fix, p.path, p.location) for p in exc.problems]
            continue
        outputs = [node.name for node in arm_spec.nodes if node.output]
        if len(outputs) != 1:
            problems.append(Problem("E_NO_OUTPUT", f"arm {arm.name!r}: an experiment scores one answer, but the graph has "
                                    f"{len(outputs)} output nodes ({', '.join(outputs)})", "keep one output node", ("nodes",)))
            continue
        blueprints[arm.name] = blueprint
    if problems:
        raise PlanError(problems)
    return blueprints


def spec_fingerprint(spec: GraphSpec) -> str:
    """sha256 of a spec (an arm's graph): result rows name it so resuming refuses stale rows."""
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
