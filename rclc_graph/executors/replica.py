"""One replica of a model, the worker side of remote execution: it loads the model once, holds
the agents of the nodes placed on it, selects for their outgoing handoffs and runs nodes with
the local executor's code.

A `Replica` is what a Ray actor runs (rclc_graph.executors.ray wraps it); the scheduler's
side is remote.py. `rclc_graph.testing.InProcessReplicasExecutor` runs several in one process.
Everything a replica receives or returns is small and plain (plans, node results, shapes,
`PayloadRef`s), except snapshot bytes, which records need on the scheduler's machine. Model
work is the local executor's, with one strategy injected: how a transfer group arrives when
its senders were selected on other replicas (`Replica.deliver`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

import rclc

from ..errors import NodeFailed
from ..plan.dag import Plan, PlanEdge, PlanNode
from ..results.run_result import NodeResult
from .contract import Publish, RunContext
from .delivery import GroupHandoff, transfer_group
from .fitting import SenderShape, shape_of, with_count
from .local import LocalExecutor
from .pool import ModelPool
from .transfer_options import transfer_options
from .transport import BytesTransport, InProcessTransport, PayloadRef, PayloadTransport
from .trusted_code import search_beside


@dataclass(frozen=True)
class RunTicket:
    """What a replica needs to know about a run; `plan` is the Plan or an awaitable reference to it
    (a Ray ObjectRef put once per run), so a plan crosses to each replica once."""

    run_id: str
    seed: int
    base_dir: str | None
    plan: Plan | Awaitable[Plan]


async def _no_events(kind: str, payload: dict[str, Any]) -> None:
    return None


class Replica:
    """A model replica's worker: its own model pool, the agents of its nodes, per-run stop flags."""

    def __init__(
        self, label: str, *, pool: ModelPool | None = None, remote_transport: PayloadTransport | None = None
    ) -> None:
        self.label = label
        self.pool = pool if pool is not None else ModelPool()
        self.local = InProcessTransport()
        self.remote: PayloadTransport = remote_transport if remote_transport is not None else BytesTransport()
        self.executor = LocalExecutor(self.pool, deliver=self.deliver)
        self.incoming: dict[tuple[str, str], dict[int, list[PayloadRef]]] = {}  # (run, node) -> edge -> refs
        self.running = 0  # nodes executing here now
        self._runs: dict[str, RunContext] = {}

    # -- runs --------------------------------------------------------------------------------

    async def context(self, ticket: RunTicket) -> RunContext:
        ctx = self._runs.get(ticket.run_id)
        if ctx is None:
            plan = ticket.plan if isinstance(ticket.plan, Plan) else await ticket.plan
            base_dir = None if ticket.base_dir is None else Path(ticket.base_dir)
            if plan.trust_code:  # as the scheduler's side does: modules beside a trusted topology import
                search_beside(base_dir)
            ctx = RunContext(run_id=ticket.run_id, plan=plan, publish=_no_events, seed=ticket.seed, base_dir=base_dir)
            self._runs.setdefault(ticket.run_id, ctx)
            ctx = self._runs[ticket.run_id]
        return ctx

    def stop(self, run_id: str) -> None:
        """End generation of this run's nodes at their next step (cancellation)."""
        ctx = self._runs.get(run_id)
        if ctx is not None:
            ctx.stop.set()

    def release(self, run_id: str) -> None:
        """Forget a run: stop it, drop its agents and any handoffs selected but not received."""
        self.stop(run_id)
        self._runs.pop(run_id, None)
        self.executor.release(run_id)
        self.local.discard(run_id)
        self.remote.discard(run_id)
        for key in [key for key in self.incoming if key[0] == run_id]:
            del self.incoming[key]

    def transport(self, ref: PayloadRef) -> PayloadTransport:
        """The transport that can receive `ref` here."""
        for transport in (self.local, self.remote):
            if transport.name == ref.transport:
                return transport
        raise RuntimeError(f"handoff: transport {ref.transport!r} is not available on replica {self.label}")

    # -- models ------------------------------------------------------------------------------

    async def warm(self, spec: Any, base_dir: str | None) -> None:
        """Load the model now (each replica loads its model once)."""
        await anyio.to_thread.run_sync(self.pool.get, spec, None if base_dir is None else Path(base_dir))

    async def fingerprint(self, spec: Any, base_dir: str | None) -> str:
        loaded = await anyio.to_thread.run_sync(self.pool.get, spec, None if base_dir is None else Path(base_dir))
        return await anyio.to_thread.run_sync(lambda: loaded.fingerprint)

    # -- handoffs ----------------------------------------------------------------------------

    async def deliver(self, handoff: GroupHandoff, receiver: Any) -> float:
        """The local executor's delivery strategy here (delivery.py): a transfer group whose
        senders other replicas selected arrives as payload refs (one delivery, messages in
        sender order) instead of through `rclc.transfer`; returns the seconds its selection took."""
        refs = self.incoming.get((handoff.ctx.run_id, handoff.node.name), {}).get(handoff.group[0].id)
        if refs is None:
            return await transfer_group(handoff, receiver)
        messages: list[Any] = []
        for ref in refs:
            messages.extend(await self.transport(ref).receive(ref))
        receiver(rclc.Delivery(handoff.request, tuple(messages)))  # the receiver prepares its prompt for the request
        return max(ref.seconds for ref in refs)

    async def room(self, ticket: RunTicket, node_name: str, request: str) -> int:
        """Free positions node `node_name` will have for a transfer conditioned on `request`
        (what the core computes before it fits the senders)."""
        ctx = await self.context(ticket)
        node = ctx.plan.node(node_name)
        agent = await anyio.to_thread.run_sync(self.executor.bind, ctx, node)
        return int(agent.prepare_request(request).available_positions)

    async def select(
        self,
        ticket: RunTicket,
        edge_id: int,
        request: str,
        count: int,
        same_host: bool,
        known: tuple[str, ...] = (),
        roles: list[str] | None = None,
        span_starts: list[int] | None = None,
    ) -> PayloadRef:
        """Select `count` positions of the edge's sender for `request` and hand back a ref
        (`known` and `roles` feed the edge's exclusion, `span_starts` its spans, as in the
        local executor)."""
        ctx = await self.context(ticket)
        edge = ctx.plan.edges[edge_id]
        try:
            agent = self.executor.agent(ctx.run_id, edge.source)
        except KeyError:
            raise LookupError(
                f"replica {self.label} holds no state of node {edge.source!r} in run {ctx.run_id!r} (the replica was "
                "restarted or the run released); resume the run to restore it"
            ) from None
        options = with_count(
            transfer_options(
                edge.policy, trust_code=ctx.plan.trust_code, seed=ctx.seed, known=tuple(known),
                roles=None if roles is None else [list(roles)],
                span_starts=None if span_starts is None else [list(span_starts)], senders=1,
            ),
            count,
        )
        received: list[Any] = []
        began = time.perf_counter()
        await rclc.transfer(agent, received.append, request, **options)
        seconds = time.perf_counter() - began
        transport = self.local if same_host else self.remote
        return transport.send(ctx.run_id, received[0].messages, seconds)

    # -- nodes -------------------------------------------------------------------------------

    async def execute(
        self,
        ticket: RunTicket,
        node: PlanNode,
        inbound: list[tuple[PlanEdge, NodeResult]],
        refs: dict[int, list[PayloadRef]],
        publish: Publish,
    ) -> tuple[NodeResult, SenderShape]:
        """Run one node here (the scheduler's node: a run-time foreach copy holds its item);
        NodeFailed as the local executor raises it."""
        ctx = await self.context(ticket)
        node_name = node.name
        key = (ctx.run_id, node_name)
        self.incoming[key] = refs
        self.running += 1
        try:
            result = await self.executor.run_node(replace(ctx, publish=publish), node, inbound)
        finally:
            self.running -= 1
            self.incoming.pop(key, None)
        if self._runs.get(ctx.run_id) is not ctx:  # released while it ran: keep nothing
            self.executor.release(ctx.run_id)
            raise RuntimeError(f"run {ctx.run_id!r} was released on replica {self.label} while node {node_name!r} ran")
        shape = await anyio.to_thread.run_sync(shape_of, self.executor.agent(ctx.run_id, node_name))
        return result, shape

    async def snapshot(self, run_id: str, node_name: str) -> bytes:
        """The node's agent as rclc snapshot bytes (records are written where the scheduler runs)."""
        agent = self.executor.agent(run_id, node_name)
        with tempfile.TemporaryDirectory(prefix="rclc-replica-") as directory:
            path = Path(directory) / "agent.safetensors"
            await agent.save(path)
            return await anyio.to_thread.run_sync(path.read_bytes)

    async def restore(self, ticket: RunTicket, node_name: str, data: bytes) -> SenderShape:
        """Bind node `node_name`'s agent here and load a snapshot into it (resume)."""
        ctx = await self.context(ticket)
        node = ctx.plan.node(node_name)
        agent = await anyio.to_thread.run_sync(self.executor.bind, ctx, node)
        with tempfile.TemporaryDirectory(prefix="rclc-replica-") as directory:
            path = Path(directory) / "agent.safetensors"
            await anyio.to_thread.run_sync(path.write_bytes, data)
            await agent.load(path)
        self.executor.adopt(ctx.run_id, node_name, agent)
        return await anyio.to_thread.run_sync(shape_of, agent)

    def describe(self) -> dict[str, Any]:
        return {"replica": self.label, "pid": str(os.getpid()), "running": self.running}


def failure_info(error: BaseException) -> dict[str, Any]:
    """A NodeFailed (or any error) as plain data, for replicas whose exceptions cannot travel."""
    if isinstance(error, NodeFailed):
        cause = error.cause
        return {"node": error.node, "edge": None if error.edge is None else error.edge.id,
                "type": type(cause).__name__, "message": str(cause)}
    return {"node": None, "edge": None, "type": type(error).__name__, "message": str(error)}
