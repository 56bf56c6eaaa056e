"""From a resolved edge policy to the keyword arguments of `rclc.transfer`, and how a node's
state edges group into transfer calls.

Consecutive state/full edges with the same policy and request travel in one transfer call, so
the core fits their budgets jointly; the local executor runs each group through one call, the
remote executor fits the same group across replicas (fitting.py).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import rclc
from rclc.policy import BUILTIN_SELECTORS, DEFAULT_REPRESENTATION, DEFAULT_SELECTOR

from ..plan.dag import PlanEdge
from ..plan.policy import ResolvedPolicy
from .trusted_code import import_callable


def resolve_selector(policy: ResolvedPolicy, *, trust_code: bool, seed: int) -> Any:
    """The callable for a policy's selector name, with its options bound."""
    name = policy.selector or DEFAULT_SELECTOR
    options = policy.options
    if name in BUILTIN_SELECTORS:  # rclc.selectors imports torch: on first use, not when rclc_graph is imported
        return rclc.selectors.builtin(name, options, seed=seed)
    base = import_callable(name, trust_code=trust_code, field_name="selector")
    return functools.partial(base, **options) if options else base


def resolve_reasoning(policy: ResolvedPolicy, *, trust_code: bool) -> dict[str, Any]:
    """The reasoning keyword arguments of `rclc.transfer` for a policy ({} without reasoning)."""
    reasoning = policy.reasoning
    if reasoning is None:
        return {}
    if reasoning.method == "latent_mass":
        method: Any = functools.partial(rclc.latent_mass, steps=reasoning.steps)
    else:
        method = import_callable(reasoning.method, trust_code=trust_code, field_name="reasoning.method")
    options: dict[str, Any] = {"reasoning": method, "reasoning_context": reasoning.context}
    if reasoning.budget is not None:
        options["reasoning_budget"] = reasoning.budget
    return options


@rclc.thread_safe  # ours and stateless: full edges of concurrent runs need not take turns (rclc.user_code)
def keep_everything(sender: Any, request_ids: Any, budget: int) -> list[int]:
    """The selector of `full` edges: every position of the sender, or an error.

    A full edge asks for r1 (the whole state), but the core fits every transfer into the
    receiver's free context and would compress a sender that does not fit. A full edge must
    never be compressed silently, so a budget below the sender's size fails the transfer
    before anything is delivered. (Planning refuses the cases it can know in advance:
    run/capacity.py.)
    """
    total = int(sender.positions)
    if budget < total:
        raise rclc.ContextLimitError(
            f"full edge: the receiver has room for {budget} of this sender's {total} positions, and a full edge "
            "hands over the whole state or nothing; raise the receiver's context_limit, give it fewer or shorter "
            "senders, or use mode: state to compress"
        )
    return list(range(total))


def transfer_options(
    policy: ResolvedPolicy,
    *,
    trust_code: bool,
    seed: int,
    known: tuple[str, ...] = (),
    roles: list[list[str]] | None = None,
    span_starts: list[list[int]] | None = None,
    senders: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of `rclc.transfer` for a state/full edge policy.

    `senders`: how many senders the call holds, when known; a lone sender gets no
    `allocation` (pooling one sender is its own budget, and its hop then says per_sender), and
    no `bridge` unless the edge named one (the default bridges fan-ins only).

    `known` (what the receiver holds: its system prompt and user turn) and `roles` (one
    label list per sender, roles.py) make the policy's `exclude` an `rclc.Exclusion`.
    `span_starts` (one list per sender: where its lineage's runs begin) keeps text-aligned
    spans from joining two inherited runs (rclc.selectors._sentences says why).
    """
    options: dict[str, Any] = {"record_selection": True, "representation": policy.representation or DEFAULT_REPRESENTATION}
    if policy.mode == "full":
        options["ratio"] = 1  # I + ceil((T - I) / 1) = T: the whole state
        options["selector"] = keep_everything  # ... and never fewer (the core would fit it to the receiver)
    else:
        if senders == 1 and policy.bridge and not policy.bridge_named:
            # the graph's default bridges fan-ins only: a lone sender's bridge is its own best
            # span, which cost the chain (docs/experiments.md#bridging-a-second-fact-dev-split-r4)
            policy = replace(policy, bridge=None)
        options["selector"] = resolve_selector(policy, trust_code=trust_code, seed=seed)
        if policy.budget is not None:
            options["budget"] = policy.budget
        else:
            options["ratio"] = policy.ratio
        if policy.allocation != "per_sender" and senders != 1:
            options["allocation"] = policy.allocation
        if span_starts is not None and any(span_starts):
            options["span_starts"] = [list(starts) for starts in span_starts]
        if policy.exclude:
            options["exclude"] = rclc.Exclusion(
                reasons=policy.exclude,
                known=tuple(text for text in known if text),
                roles=None if roles is None else tuple(roles),
            )
    options.update(resolve_reasoning(policy, trust_code=trust_code))
    return options


def state_groups(edges: list[PlanEdge]) -> list[list[PlanEdge]]:
    """The transfer calls a node's inbound state/full edges make, in arrival order: consecutive
    edges sharing policy and request travel in one call."""
    groups: list[list[PlanEdge]] = []
    for edge in edges:
        if edge.policy.mode == "text":
            continue
        if groups and groups[-1][0].policy == edge.policy and groups[-1][0].request == edge.request:
            groups[-1].append(edge)
        else:
            groups.append([edge])
    return groups
