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
reasoning methods and tools, which are also described for the model): it imports each one
before any model work, so a typo in a
module name is refused at once instead of when its edge is reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import PlanError, Problem
from ..executors.prompts import render_prompt
from ..executors.tools import load_toolbox, tool_prompt
from ..executors.trusted_code import import_callable
from ..plan.dag import Plan


def prompt_tokens(tokenizer: Any, plan: Plan, name: str) -> int:
    """Tokens of the node's own rendered prompt (chat template applied, tools described, no text messages)."""
    node = plan.node(name)
    if node.agent.tools and plan.trust_code:
        text, _ = tool_prompt(tokenizer, node.agent.system, node.prompt, load_toolbox(node.agent, trust_code=True))
    else:
        text = render_prompt(tokenizer, node.agent.system, node.prompt, generation_prompt=node.generate)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_context(plan: Plan, pool: Any, base_dir: Path | None = None) -> None:
    """Raise PlanError (E_CONTEXT) for every node whose prompt and output cannot fit its context.

    Also refuses an agent `context_limit` above its model's own limit (the agent would
    refuse it when bound, i.e. after earlier nodes already ran).
    """
    declared = {node.name: index for index, node in enumerate(plan.spec.nodes)}
    agents = {agent.name: index for index, agent in enumerate(plan.spec.agents) if hasattr(agent, "name")}
    problems: list[Problem] = []
    reported_agents: set[str] = set()
    for node in plan.nodes:
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
        try:
            tokens = prompt_tokens(profile.tokenizer, plan, node.name)
        except Exception as error:  # the chat template comes with the model's files and may raise anything
            problems.append(Problem(
                "E_TEMPLATE",
                f"the chat template of model {node.model.name!r} fails on node {node.name!r}: "
                f"{type(error).__name__}: {error}",
                "fix the chat template in the model's tokenizer files, or the prompt it refuses",
                ("nodes", declared.get(node.declared, 0), "prompt"),
            ))
            continue
        output = spec.max_new_tokens if node.generate else 0
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
    if problems:
        raise PlanError(problems)


def check_code(plan: Plan) -> None:
    """Raise PlanError (E_UNKNOWN_REF) for every module:callable the plan names that cannot be
    imported or is not callable. Imports only when the plan was compiled with trust_code
    (without it, validation has already refused such names with E_TRUST_CODE)."""
    if not plan.trust_code:
        return
    problems: list[Problem] = []
    seen: set[tuple[int, str]] = set()
    for edge in plan.edges:
        policy = edge.policy
        references = [("selector", policy.selector)]
        if policy.reasoning is not None:
            references.append(("reasoning.method", policy.reasoning.method))
        for field_name, reference in references:
            if not reference or ":" not in reference or (edge.declared, field_name) in seen:
                continue
            seen.add((edge.declared, field_name))
            try:
                import_callable(reference, trust_code=True, field_name=field_name)
            except Exception as error:  # an import runs the module's code, which may raise anything
                problems.append(Problem(
                    "E_UNKNOWN_REF",
                    f"{field_name} {reference!r} cannot be used: {type(error).__name__}: {error}",
                    "check the module is importable (on PYTHONPATH) and names a callable",
                    ("edges", edge.declared, "policy", *field_name.split(".")),
                ))
    agents = {agent.name: index for index, agent in enumerate(plan.spec.agents) if hasattr(agent, "name")}
    described: set[str] = set()
    for node in plan.nodes:
        spec = node.agent
        if not spec.tools or spec.name in described:
            continue
        described.add(spec.name)
        try:
            load_toolbox(spec, trust_code=True)
        except Exception as error:  # an import runs the module's code, which may raise anything
            problems.append(Problem(
                "E_UNKNOWN_REF",
                f"agent {spec.name!r}: a tool cannot be used: {type(error).__name__}: {error}",
                "check each tool's module is importable (on PYTHONPATH), names a function, and that the function has "
                "type hints and a docstring",
                ("agents", agents.get(spec.name, 0), "tools"),
            ))
    if problems:
        raise PlanError(problems)
