"""A node's inbound handoffs, delivered into its agent: text hops at once, each transfer group
through a delivery strategy, and the hop record of every handoff as the receiver holds it.

The strategy is how a transfer group's selected rows reach the receiver, and the one thing
executors differ in here: `transfer_group` runs `rclc.transfer` from sender agents held in
this process (the local executor); a replica delivers what other replicas selected from
payload refs, and falls back to `transfer_group` for senders it holds (replica.py). An
executor takes its strategy as a constructor argument (`LocalExecutor(pool, deliver=...)`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import rclc

from ..errors import node_failed
from ..plan.dag import PlanEdge, PlanNode
from ..results.lineage import Hop, Lineage, compose_hop
from ..results.run_events import hop_payload
from ..results.run_result import NodeResult
from .contract import Inbound, RunContext
from .prompts import group_request
from .roles import delivered_roles, sender_roles, sender_span_starts
from .transfer_options import state_groups, transfer_options


@dataclass(frozen=True)
class GroupHandoff:
    """One transfer group to deliver into `node`'s agent: its edges (one policy, one request),
    the request, what the receiver holds besides its handoffs (`known`, for exclusion), each
    sender's position labels (`roles`) and run starts (`span_starts`, from lineage), and how to
    reach a sender's agent held in this process (`sender_agent(node_name)`)."""

    ctx: RunContext
    node: PlanNode
    group: list[PlanEdge]
    request: str
    known: tuple[str, ...]
    roles: list[list[str]]
    span_starts: list[list[int]]
    sender_agent: Callable[[str], object] = field(repr=False)


Deliver = Callable[[GroupHandoff, object], Awaitable[float]]
"""`await deliver(handoff, receiver)`: leave one delivery of the group in `receiver`; returns the
seconds spent on it elsewhere (selection that ran before this call, e.g. on another replica)."""


async def transfer_group(handoff: GroupHandoff, receiver: object) -> float:
    """The local strategy: one `rclc.transfer` call from the senders' agents held here (so
    budgets are fitted across the senders); nothing was spent elsewhere."""
    ctx = handoff.ctx
    options = transfer_options(
        handoff.group[0].policy, trust_code=ctx.plan.trust_code, seed=ctx.seed, known=handoff.known,
        roles=handoff.roles, span_starts=handoff.span_starts, senders=len(handoff.group),
    )
    sending = [handoff.sender_agent(edge.source) for edge in handoff.group]
    await rclc.transfer(sending, receiver, handoff.request, **options)
    return 0.0


@dataclass
class Received:
    """What a node's handoffs left: their hops (in arrival order), how many deliveries its agent
    holds, and the role labels of the rows they delivered."""

    hops: list[Hop] = field(default_factory=list)
    deliveries: int = 0
    roles: list[str] = field(default_factory=list)

    @property
    def inherited(self) -> int:
        """Positions the state handoffs delivered (what the node inherited)."""
        return sum(hop.record.kept_positions for hop in self.hops if hop.record.mode != "text")


async def receive(
    ctx: RunContext, node: PlanNode, agent: object, inbound: Inbound, content: str,
    deliver: Deliver, sender_agent: Callable[[str], object],
) -> Received:
    """Deliver every inbound handoff of `node` into `agent` and publish each hop as soon as the
    receiver holds it (before it generates): text hops first (they arrive with the prompt), then
    one delivery per transfer group (`deliver`)."""
    received = Received()
    senders = {edge.id: result for edge, result in inbound}
    for edge, sender in inbound:
        if edge.policy.mode == "text":  # a text handoff is delivered with the prompt: at once
            received.hops.append(compose_hop(
                Lineage(), [], source=edge.source, target=node.name, inherited_positions=0, budget=0,
                payload_bytes=len(sender.effective_text.encode("utf-8")), mode="text", policy="text", edge=edge.id,
            ))
            await ctx.publish("hop", hop_payload(received.hops[-1]))
    known = (node.agent.system, content)  # what this node holds besides its handoffs
    for group in state_groups([edge for edge, _ in inbound]):
        handoff = GroupHandoff(
            ctx, node, group, group_request(group[0], content), known,
            roles=[sender_roles(senders[edge.id], senders[edge.id].positions) for edge in group],
            span_starts=[sender_span_starts(senders[edge.id], senders[edge.id].positions) for edge in group],
            sender_agent=sender_agent,
        )
        began = time.perf_counter()
        with node_failed(node.name, group[0]):
            elsewhere = await deliver(handoff, agent)
        seconds = time.perf_counter() - began + elsewhere
        delivery, _ = agent.peek(received.deliveries)  # type: ignore[attr-defined]
        received.deliveries += 1
        for edge, message in zip(group, delivery.messages):
            received.hops.append(state_hop(node, edge, senders[edge.id], message, seconds))
            selection = message.selection
            received.roles += delivered_roles(
                senders[edge.id], selection.indices, selection.source_positions, selection.added_latent_positions
            )
            await ctx.publish("hop", hop_payload(received.hops[-1]))  # the receiver holds it; it has not generated
    return received


def state_hop(node: PlanNode, edge: PlanEdge, sender: NodeResult, message: rclc.Message, seconds: float) -> Hop:
    """The hop of one sender's message in a state/full delivery, from its selection record."""
    selection = message.selection
    seen = sender.lineage
    extra = selection.source_positions - len(seen)  # rows full-context reasoning added before selection
    if extra > 0:
        seen = seen.extend(edge.source, extra, "latent")
    return compose_hop(
        seen,
        list(selection.indices),
        source=edge.source,
        target=node.name,
        inherited_positions=sender.inherited_positions,
        budget=selection.budget,
        payload_bytes=message.nbytes,
        added_latent_positions=selection.added_latent_positions,
        mode=edge.policy.mode,
        policy=edge.policy.label,
        edge=edge.id,
        selection_seconds=seconds,
        excluded_by_reason=selection.excluded,
        allocation=selection.allocation,
        fitted_budget=selection.cap if selection.allocation == "pooled" else None,
        bridge=selection.bridge,
    )
