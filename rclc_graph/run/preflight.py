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
from ..executors.prompts import render_prompt
from ..executors.tools import encode_tool_prompt, load_toolbox, tool_prompt
from ..executors.trusted_code import import_callable, search_beside
from ..plan.dag import Plan
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


def check_context(plan: Plan, pool: Any, base_dir: Path | None = None, *, imports: bool = True) -> None:
    """Raise PlanError (E_CONTEXT) for every node whose prompt and output cannot fit its context.

    `imports` False: nothing the topology names is imported (`rclc-graph validate` without
    --check-imports), so tool agents are counted without their tools' descriptions. Also refuses an agent `context_limit` above its model's own limit (the agent would
    refuse it when bound, i.e. after earlier nodes already ran), and receivers that cannot
    hold what their edges must deliver (capacity.py).
    """
    declared = {node.name: index for index, node in enumerate(plan.spec.nodes)}
    agents = {agent.name: index for index, agent in enumerate(plan.spec.agents) if hasattr(agent, "name")}
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
                    ("agents", agents.get(spec.name, 0), "context_limit"),
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
                ("nodes", declared.get(node.declared, 0), "prompt"),
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
                ("nodes", declared.get(node.declared, 0), "prompt"),
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
                ("nodes", declared.get(node.declared, 0), "prompt"),
            ))
    if not problems:
        problems = fan_in_problems(plan, limits, prompt_counter(pool, base_dir))
    if problems:
        raise PlanError(problems)


def _declared_policies(target: Plan | Blueprint) -> list[tuple[int, ResolvedPolicy]]:
    """(declared edge index, policy) of every edge, from a plan's edges or a blueprint's."""
    if isinstance(target, Blueprint):
        return list(enumerate(target.policies))
    return [(edge.declared, edge.policy) for edge in target.edges]


def _tool_agents(target: Plan | Blueprint) -> list[AgentSpec]:
    """The agents with tools that nodes of the plan (or blueprint) use, each once."""
    if isinstance(target, Blueprint):
        agents = [target.agents[node.agent] for node in target.spec.nodes if node.agent is not None]
    else:
        agents = [node.agent for node in target.nodes if node.agent is not None]
    unique: dict[str, AgentSpec] = {}
    for agent in agents:
        if agent.tools:
            unique.setdefault(agent.name, agent)
    return list(unique.values())


def check_code(plan: Plan | Blueprint, base_dir: Path | None = None) -> None:
    """Raise PlanError (E_UNKNOWN_REF) for every module:callable the plan (or a blueprint: a
    topology without inputs) names that cannot be imported or is not callable. Imports only
    when it was compiled with trust_code (without it, validation has already refused such
    names with E_TRUST_CODE); modules beside the topology (`base_dir`) import too."""
    if not plan.trust_code:
        return
    search_beside(base_dir)
    problems: list[Problem] = []
    seen: set[tuple[int, str]] = set()
    declared = {node.name: index for index, node in enumerate(plan.spec.nodes)}
    references: list[tuple[str, str, tuple[str | int, ...]]] = []
    for node in plan.spec.nodes:
        if node.call is not None and node.call not in plan.functions:
            references.append(("call", node.call, ("nodes", declared[node.name], "call")))
    for index, edge_spec in enumerate(plan.spec.edges):
        for field_name in ("when", "until"):
            for reference in predicates.routers(getattr(edge_spec, field_name)):
                references.append((f"{field_name} router", reference, ("edges", index, field_name)))
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
    for declared_edge, policy in _declared_policies(plan):
        references = [("selector", policy.selector)]
        if policy.reasoning is not None:
            references.append(("reasoning.method", policy.reasoning.method))
        for field_name, reference in references:
            if not reference or ":" not in reference or (declared_edge, field_name) in seen:
                continue
            seen.add((declared_edge, field_name))
            try:
                function = import_callable(reference, trust_code=True, field_name=field_name)
            except Exception as error:  # an import runs the module's code, which may raise anything
                problems.append(Problem(
                    "E_UNKNOWN_REF",
                    f"{field_name} {reference!r} cannot be used: {type(error).__name__}: {error}",
                    _IMPORTABLE + " and names a callable",
                    ("edges", declared_edge, "policy", *field_name.split(".")),
                ))
                continue
            if field_name == "selector" and policy.selector_options:
                problem = _unbound_options(function, policy.options)
                if problem is not None:
                    problems.append(Problem(
                        "E_POLICY", f"selector {reference!r}: {problem}", "pass only options its signature takes",
                        ("edges", declared_edge, "policy", "selector_options"),
                    ))
    agents = {agent.name: index for index, agent in enumerate(plan.spec.agents) if hasattr(agent, "name")}
    for spec in _tool_agents(plan):
        try:
            load_toolbox(spec, trust_code=True)
        except Exception as error:  # an import runs the module's code, which may raise anything
            problems.append(Problem(
                "E_UNKNOWN_REF",
                f"agent {spec.name!r}: a tool cannot be used: {type(error).__name__}: {error}",
                "check each tool's module is importable (on PYTHONPATH, installed, or next to the topology file), "
                "names a function, and that the function has "
                "type hints and a docstring",
                ("agents", agents.get(spec.name, 0), "tools"),
            ))
    if problems:
        raise PlanError(problems)


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
