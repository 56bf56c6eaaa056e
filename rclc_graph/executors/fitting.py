"""Budgets of a transfer whose senders live on different hosts, fitted exactly as the core does.

`rclc.transfer` fits a call's senders jointly against the receiver's free positions
(`rclc.policy.fit`, pure integers) and then selects each sender with its fitted count. When
the senders sit on other hosts, the scheduler's process does the same arithmetic from small
metadata (each sender's T, I and latent tail, the receiver's free positions) and each
sender's host selects with `budget=count`, which keeps exactly `count` positions because a
count never exceeds the sender's own cap. The selected rows then equal those of one local
transfer call.

Full-context reasoning (`reasoning.context: full | full_with_request`) appends rows to each
sender *before* the fit, so the fit would need a round trip per sender after reasoning; that
case is refused with NotImplementedError rather than fitted differently. So is pooled
allocation that an edge names, whose counts depend on every sender's scores; pooled allocation
the graph's default chose falls back to per-sender budgets here (`split_options`; the hop
records say per_sender). A bridge (`bridge`) is the same: a group of several senders that
names one is refused; the default's is never there, since each host selects one sender and a
lone sender gets no default bridge (transfer_options.py). A group whose senders all sit on
the receiver's replica goes through one local `rclc.transfer` and pools and bridges as
in-process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import rclc
from rclc.policy import BudgetPolicy, fit, floor


@dataclass(frozen=True)
class SenderShape:
    """What the budget fit needs of one sender's state."""

    positions: int  # T
    inherited: int  # I
    latent_steps: int


def shape_of(agent: Any) -> SenderShape:
    """The shape of a bound agent's current state (its retained or history state)."""
    state = agent.sender_state()
    return SenderShape(state.positions, state.inherited_positions, state.latent_steps)


def split_options(options: dict[str, Any], *, allocation_named: bool) -> dict[str, Any]:
    """The transfer options of a group whose senders sit on other hosts: pooled allocation the
    graph's default chose becomes per-sender budgets (pooling needs every sender's scores in
    one place); one the edge named stays, and `refuse_unmatched` refuses it."""
    if options.get("allocation") == "pooled" and not allocation_named:
        return {key: value for key, value in options.items() if key != "allocation"}
    return options


def refuse_unmatched(options: dict[str, Any], *, edge: str, senders: int = 2, bridge_named: bool = False) -> None:
    """NotImplementedError for transfer options a split fit cannot reproduce exactly
    (`senders`: the group's; `bridge_named`: the edge wrote `bridge`, which a group of several
    senders cannot have across hosts; one sender's bridge is computed on its own host)."""
    if options.get("allocation", "per_sender") == "pooled":
        raise NotImplementedError(
            f"edge {edge}: allocation 'pooled' across hosts is not supported: the pooled ranking needs every sender's "
            "scores in one place, and these senders sit on other replicas than the receiver; pin the senders to the "
            "receiver's replica (--pin), or use allocation: per_sender"
        )
    if senders > 1 and bridge_named:
        raise NotImplementedError(
            f"edge {edge}: bridge across hosts is not supported: the bridge is the best span across every sender's "
            "scores, and these senders sit on other replicas than the receiver; pin the senders to the receiver's "
            "replica (--pin), or remove bridge"
        )
    reasoning = options.get("reasoning")
    context = options.get("reasoning_context")
    if reasoning is not None and (context is None or str(context).startswith("full")):
        raise NotImplementedError(
            f"edge {edge}: full-context reasoning (reasoning.context {context or 'full'!r}) across hosts is not "
            "supported: the senders' budgets are fitted after reasoning, which needs every sender on the receiver's "
            "host; pin the senders to the receiver's replica, or use reasoning.context 'selected'"
        )


def fit_counts(options: dict[str, Any], senders: Sequence[SenderShape], available: int) -> list[int]:
    """The positions each sender keeps in one transfer call with `options` (transfer keyword
    arguments) into a receiver with `available` free positions; ValueError as the core raises."""
    policy = BudgetPolicy.from_options(options.get("ratio"), options.get("budget"))
    selector = options.get("selector") or rclc.selectors.cacheback  # rclc.transfer's default
    builtin = rclc.selectors.is_builtin(selector)
    context = options.get("reasoning_context")
    reserve = 0
    if options.get("reasoning") is not None and context is not None and not str(context).startswith("full"):
        reserve = int(options.get("reasoning_budget") or 0)
    caps = [policy.cap(shape.positions, shape.inherited, reserve) for shape in senders]
    floors = [floor(builtin=builtin, latent_steps=shape.latent_steps, reserve=reserve) for shape in senders]
    return fit(caps, floors, available)


def with_count(options: dict[str, Any], count: int) -> dict[str, Any]:
    """Transfer options that make one sender keep exactly its fitted `count` positions."""
    single = {key: value for key, value in options.items() if key not in ("ratio", "budget")}
    single["budget"] = count
    return single
