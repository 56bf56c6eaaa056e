"""Checks a plan needs a tokenizer for, run before any weights are loaded.

Planning is torch-free and catches every mistake the spec and the inputs show on their
own. One more class of mistake only shows once prompts are counted in tokens: a prompt
that, with the tokens its node must generate, cannot fit the model's context whatever
its senders hand over. Without this check such a run loads the model, runs every node
before that one, and fails there, minutes or hours later. With it, the run is refused
at once, naming the node, the counts and the YAML line of the prompt.

The check reads only each model's tokenizer and config (`ModelPool.profile`). It is a
lower bound on purpose: inherited rows are fitted to the receiver's room by the
transfer core, so only a node's own prompt plus its output can make a run impossible.

`check_code` does the same for code a trusted topology names (module:callable selectors,
reasoning methods, function nodes, routers and tools, which are also described for the model):
it imports each one before any model work, so a typo in a module name is refused at once
instead of when its node or edge is reached.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import rclc

from ..errors import PlanError, Problem
from ..executors.pool import ModelPool
from ..executors.prompts import render_prompt
from ..executors.tools import encode_tool_prompt, load_toolbox, tool_prompt
from ..executors.trusted_code import import_callable, search_beside
from ..plan.dag import Plan, PlanNode
from ..plan.policy import ResolvedPolicy
from ..plan.validate import Blueprint
from ..spec.models import AgentSpec
from .capacity import fan_in_problems, prompt_counter
from ..spec import predicates


def prompt_tokens(tokenizer: Any, plan: Plan, name: str, *, imports: bool = True) -> int:
    """Tokens of the node's own rendered prompt (chat template applied, tools described, no text
    messages). Describing tools imports them; with `imports` False a tool agent's prompt is
    counted without its tools' descriptions (a lower bound, as the check is)."""
    node = plan.node(name)
    if node.agent.tools and plan.trust_code and imports:
        text, conversation = tool_prompt(
            tokenizer, node.agent.system, node.prompt, load_toolbox(node.agent, trust_code=True)
        )
        return len(encode_tool_prompt(tokenizer, text, conversation))
    return len(render_prompt(tokenizer, node.agent.system, node.prompt, generation_prompt=node.generate))


_IMPORTABLE = "check the module is importable (on PYTHONPATH, installed, or next to the topology file)"
_FIRST_PREFIX = 4096  # characters of a long prompt tokenized first


def least_prompt_tokens(tokenizer: Any, text: str, limit: int) -> int | None:
    """A lower bound above `limit` on the tokens of `text` when a prefix already shows it
    cannot fit, else None; tokenizes only as much as it needs.

    Tokenizing a multi-megabyte document takes minutes; a prefix of a few times the limit in
    characters usually has enough tokens to prove the point. The prefix is cut at a space or
    newline, and 2 tokens are taken off its count for the cut (a token can merge across it),
    so the bound holds for the whole text.
    """
    size = _FIRST_PREFIX + 4 * limit
    while size < len(text):
        cut = max(text.rfind(" ", 0, size), text.rfind("\n", 0, size))
        prefix = text[: cut if cut > 0 else size]
        least = len(rclc.encode_literal(tokenizer, prefix)) - 2
        if least > limit:
            return least
        size *= 4
    return None


def check_context(plan: Plan, pool: ModelPool, base_dir: Path | None = None, *, imports: bool = True) -> None:
    """Raise PlanError (E_CONTEXT) for every node whose prompt and output cannot fit its context.

    `imports` False: nothing the topology names is imported (`rclc-graph validate` without
    --check-imports), so tool agents are counted without their tools' descriptions. Also refuses an agent `context_limit` above its model's own limit (the agent would
    refuse it when bound, i.e. after earlier nodes already ran), and receivers that cannot
    hold what their edges must deliver (capacity.py).
    """
    problems: list[Problem] = []
    reported_agents: set[str] = set()
    limits: dict[str, int] = {}
    for node in plan.nodes:
        if node.model is None:
            continue  # a function node: no model, no context
        if node.model.is_api:  # the server counts its own context; we have no tokenizer for it
            continue
        profile = pool.profile(node.model, base_dir)
        limit = profile.context_limit
        spec = node.agent
        if spec.context_limit is not None and spec.context_limit > limit:
            if spec.name not in reported_agents:
                reported_agents.add(spec.name)
                problems.append(Problem(
                    "E_CONTEXT",
                    f"agent {spec.name!r} sets context_limit {spec.context_limit}, above the {limit} positions "
                    f"model {node.model.name!r} supports",
                    f"set context_limit to at most {limit}, or remove it",
                    agent_path(plan, node) + ("context_limit",),
                ))
            continue
        if spec.context_limit is not None:
            limit = spec.context_limit
        limits[node.name] = limit
        output = spec.max_new_tokens if node.generate else 0
        least = least_prompt_tokens(profile.tokenizer, node.prompt, limit - output)
        if least is not None:
            problems.append(Problem(
                "E_CONTEXT",
                f"node {node.name!r} needs more than {least} prompt tokens (counted on a prefix of its prompt), "
                f"more than the {limit - output} positions its context limit of {limit} leaves"
                + (f" after {output} to generate (max_new_tokens)" if output else ""),
                "shorten the inputs its prompt reads (split long documents across foreach copies)",
                node_path(plan, node) + ("prompt",),
            ))
            continue
        try:
            tokens = prompt_tokens(profile.tokenizer, plan, node.name, imports=imports)
        except Exception as error:  # the chat template comes with the model's files and may raise anything
            problems.append(Problem(
                "E_TEMPLATE",
                f"the chat template of model {node.model.name!r} fails on node {node.name!r}: "
                f"{type(error).__name__}: {error}",
                "fix the chat template in the model's tokenizer files, or the prompt it refuses",
                node_path(plan, node) + ("prompt",),
            ))
            continue
        if tokens + output > limit:
            needs = f"{tokens} prompt tokens" + (f" + {output} to generate (max_new_tokens)" if output else "")
            problems.append(Problem(
                "E_CONTEXT",
                f"node {node.name!r} needs {needs} = {tokens + output} positions, more than its context limit of "
                f"{limit}, before anything is handed to it",
                "shorten the inputs its prompt reads (split long documents across foreach copies)"
                + (", or lower max_new_tokens" if output else ""),
                node_path(plan, node) + ("prompt",),
            ))
    if not problems:
        problems = fan_in_problems(plan, limits, prompt_counter(pool, base_dir))
    if problems:
        raise PlanError(problems)


def _declared_policies(target: Plan | Blueprint) -> list[tuple[tuple[str | int, ...], ResolvedPolicy]]:
    """(where the spec edge is written, policy) of every edge, from a plan's edges or a
    blueprint's (and its subgraphs')."""
    if isinstance(target, Blueprint):
        return [(prefix + ("edges", index), policy) for prefix, blueprint in _blueprints(target)
                for index, policy in enumerate(blueprint.policies)]
    return [(edge.spec_path or ("edges", edge.declared), edge.policy) for edge in target.edges]


def _tool_agents(target: Plan | Blueprint) -> list[tuple[tuple[str | int, ...], AgentSpec]]:
    """(where it is declared, agent) of the agents with tools that nodes of the plan (or
    blueprint, subgraphs included) use, each once."""
    found: dict[tuple[str | int, ...], AgentSpec] = {}
    if isinstance(target, Blueprint):
        for prefix, blueprint in _blueprints(target):
            names = [getattr(agent, "name", None) for agent in blueprint.spec.agents]
            for node in blueprint.spec.nodes:
                agent = None if node.agent is None else blueprint.agents.get(node.agent)
                if agent is not None and agent.tools:
                    index = names.index(agent.name) if agent.name in names else 0
                    found.setdefault(prefix + ("agents", index), agent)
    else:
        for node in target.nodes:
            if node.agent is not None and node.agent.tools:
                found.setdefault(agent_path(target, node), node.agent)
    return list(found.items())


def _blueprints(blueprint: Blueprint, prefix: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], Blueprint]]:
    """(field path, blueprint) of `blueprint` and every subgraph inside it, depth first (as
    GraphSpec.topologies walks the spec)."""
    found = [(prefix, blueprint)]
    names = [node.name for node in blueprint.spec.nodes]
    for name, inner in blueprint.subgraphs.items():
        found += _blueprints(inner, prefix + ("nodes", names.index(name), "graph"))
    return found


def check_code(plan: Plan | Blueprint, base_dir: Path | None = None) -> None:
    """Raise PlanError (E_UNKNOWN_REF) for every module:callable the plan (or a blueprint: a
    topology without inputs) names that cannot be imported or is not callable. Imports only
    when it was compiled with trust_code (without it, validation has already refused such
    names with E_TRUST_CODE); modules beside the topology (`base_dir`) import too."""
    if not plan.trust_code:
        return
    search_beside(base_dir)
    problems: list[Problem] = []
    seen: set[tuple[tuple[str | int, ...], str]] = set()
    references: list[tuple[str, str, tuple[str | int, ...]]] = []
    for prefix, topology in plan.spec.topologies():  # subgraphs name code too
        for index, spec_node in enumerate(topology.nodes):
            if spec_node.call is not None and spec_node.call not in plan.functions:
                references.append(("call", spec_node.call, prefix + ("nodes", index, "call")))
        for index, edge_spec in enumerate(topology.edges):
            for field_name in ("when", "until"):
                for reference in predicates.routers(getattr(edge_spec, field_name)):
                    references.append((f"{field_name} router", reference, prefix + ("edges", index, field_name)))
    for field_name, reference, path in references:
        try:
            import_callable(reference, trust_code=True, field_name=field_name)
        except Exception as error:  # an import runs the module's code, which may raise anything
            problems.append(Problem(
                "E_UNKNOWN_REF",
                f"{field_name} {reference!r} cannot be used: {type(error).__name__}: {error}",
                _IMPORTABLE + " and names a callable",
                path,
            ))
    for path, policy in _declared_policies(plan):
        references = [("selector", policy.selector)]
        if policy.reasoning is not None:
            references.append(("reasoning.method", policy.reasoning.method))
        for field_name, reference in references:
            if not reference or ":" not in reference or (path, field_name) in seen:
                continue
            seen.add((path, field_name))
            try:
                function = import_callable(reference, trust_code=True, field_name=field_name)
            except Exception as error:  # an import runs the module's code, which may raise anything
                problems.append(Problem(
                    "E_UNKNOWN_REF",
                    f"{field_name} {reference!r} cannot be used: {type(error).__name__}: {error}",
                    _IMPORTABLE + " and names a callable",
                    path + ("policy", *field_name.split(".")),
                ))
                continue
            if field_name == "selector" and policy.selector_options:
                problem = _unbound_options(function, policy.options)
                if problem is not None:
                    problems.append(Problem(
                        "E_POLICY", f"selector {reference!r}: {problem}", "pass only options its signature takes",
                        path + ("policy", "selector_options"),
                    ))
    for path, spec in _tool_agents(plan):
        try:
            load_toolbox(spec, trust_code=True)
        except Exception as error:  # an import runs the module's code, which may raise anything
            problems.append(Problem(
                "E_UNKNOWN_REF",
                f"agent {spec.name!r}: a tool cannot be used: {type(error).__name__}: {error}",
                "check each tool's module is importable (on PYTHONPATH, installed, or next to the topology file), "
                "names a function, and that the function has "
                "type hints and a docstring",
                path + ("tools",),
            ))
    if problems:
        raise PlanError(problems)


def node_path(plan: Plan, node: PlanNode) -> tuple[str | int, ...]:
    """Where `node`'s spec node is written (inside its subgraph, if it has one)."""
    return node.spec_path or ("nodes", next((i for i, item in enumerate(plan.spec.nodes) if item.name == node.declared), 0))


def agent_path(plan: Plan, node: PlanNode) -> tuple[str | int, ...]:
    """Where the agent of `node` is declared (in the topology that declares the node)."""
    prefix = node_path(plan, node)[:-2]
    topology = dict(plan.spec.topologies())[prefix]
    names = [agent.name for agent in topology.agents]
    name = None if node.agent is None else node.agent.name
    return prefix + ("agents", names.index(name) if name in names else 0)


def _unbound_options(function: Any, options: dict[str, Any]) -> str | None:
    """Why `function(sender, request_ids, budget, **options)` cannot be called, or None."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: it decides at call time
    try:
        signature.bind(None, None, 0, **options)
    except TypeError as error:
        return str(error)
    return None
