"""The scheduler's side of executors whose nodes run on model replicas elsewhere.

`RemoteExecutor` implements the executor contract on top of replicas it reaches through
`ReplicaHandle`s (replica.py is the other side); a backend supplies how replicas start
(`RayExecutor`: Ray actors; `rclc_graph.testing.InProcessReplicasExecutor`: several in this
process). Per node it:

1. places the node (placement.py: the run's replica of its model, or a pin);
2. for each transfer group whose senders are not all on that replica, asks the receiving
   replica for its free positions, fits the senders' counts (fitting.py, the core's
   arithmetic) and has each sender's replica select with its count; what comes back is a
   `PayloadRef` per sender (the payload stays with the transport, e.g. in Ray's object store);
3. runs the node on its replica with those refs, publishing its token events as they arrive;
4. adds where the node and each hop ran, and the bytes that crossed machines.

Groups whose senders all live on the receiving replica go through one `rclc.transfer` there,
as in-process. Records, resume and cancellation go through the same handles: `agent()` and
`bind()` return `RemoteAgent` proxies whose `save`/`load` move snapshot bytes to and from the
replica that holds (or will hold) the node.
"""

from __future__ import annotations

import builtins
from abc import abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Protocol

import anyio

from rclc.files import write_atomic

from ..errors import HostDied, NodeFailed, RemoteNodeFailure, UsageError, node_failed
from ..plan.dag import Plan, PlanEdge, PlanNode
from ..results.lineage import HopRecord
from ..results.run_result import NodeResult
from .contract import Executor, Inbound, Publish, RunContext
from .fitting import SenderShape, fit_counts, refuse_unmatched, split_options
from .function_node import run_function_node
from .loaded_model import model_key
from .openai_model import load_model as load_api_model
from .openai_model import run_api_node
from .placement import ReplicaGroup, check_pins, group_key, pinned
from .prompts import compose_content, group_request
from .replica import RunTicket
from .roles import sender_roles, sender_span_starts
from .transfer_options import state_groups, transfer_options


class ReplicaHandle(Protocol):
    """The scheduler's view of one replica (a Ray actor, an object in this process)."""

    placement: dict[str, str]  # {"replica": "base#0", "actor": ..., "node": machine id}
    dead: bool

    async def call(self, method: str, *args: Any) -> Any: ...

    async def run_node(
        self, ticket: RunTicket, node: PlanNode, inbound: list[tuple[PlanEdge, NodeResult]],
        refs: dict[int, list[Any]], publish: Publish,
    ) -> tuple[NodeResult, SenderShape]: ...

    def stop(self, run_id: str) -> None: ...

    def release(self, run_id: str) -> None: ...

    def close(self) -> None: ...


@dataclass
class _Run:
    ticket: RunTicket
    plan: Plan
    base_dir: Path | None
    replicas: dict[tuple[Any, ...], int] = field(default_factory=dict)  # group key -> the run's replica
    where: dict[str, ReplicaHandle] = field(default_factory=dict)  # finished node -> its replica
    shapes: dict[str, SenderShape] = field(default_factory=dict)
    outputs_left: set[str] = field(default_factory=set)
    used: dict[int, ReplicaHandle] = field(default_factory=dict)  # every replica a node of the run was sent to
    active: bool = True


class RemoteAgent:
    """A node's agent as seen from the scheduler: it lives on a replica; records and resume move
    its snapshot bytes (never its model) through this proxy."""

    def __init__(self, executor: RemoteExecutor, run_id: str, node: PlanNode, host: ReplicaHandle | None = None) -> None:
        self.executor, self.run_id, self.node = executor, run_id, node
        self.host = host
        self.shape: SenderShape | None = None

    async def save(self, path: Any) -> None:
        """Write the node's snapshot (bytes fetched from its replica) to `path`, atomically."""
        if self.host is None:
            raise UsageError(f"agent: node {self.node.name!r} holds no state yet")
        data = await self.executor._guard(self.host, self.node.name, self.host.call("snapshot", self.run_id, self.node.name))
        await anyio.to_thread.run_sync(write_atomic, path, data)

    async def load(self, path: Any) -> None:
        """Restore a snapshot on the replica that will hold this node in its run."""
        data = await anyio.to_thread.run_sync(Path(path).read_bytes)
        run = self.executor._runs[self.run_id]
        host = self.executor._place(run, self.node)
        self.shape = await self.executor._guard(
            host, self.node.name, host.call("restore", run.ticket, self.node.name, data)
        )
        self.host = host


class RemoteExecutor(Executor):
    """Runs each node on a replica of its model's replica group (see the module docstring)."""

    name = "remote"

    def __init__(self, *, pins: Mapping[str, int] | None = None, replicas: Mapping[str, int] | None = None) -> None:
        self.pins = dict(pins or {})
        self.replicas = dict(replicas or {})  # model name -> replicas, overriding the topology's
        for name, count in self.replicas.items():
            if type(count) is not int or count < 1:
                raise UsageError(f"replicas: {name}={count!r} is not a replica count; use an int >= 1")
        self._groups: dict[tuple[Any, ...], ReplicaGroup] = {}
        self._hosts: dict[tuple[tuple[Any, ...], int], ReplicaHandle] = {}
        self._runs: dict[str, _Run] = {}

    # -- what a backend provides ---------------------------------------------------------------

    @abstractmethod
    def _start_host(self, group: ReplicaGroup, index: int) -> ReplicaHandle:
        """Start replica `index` of `group` (a Ray actor, an object in this process) and return
        the scheduler's handle on it."""

    def _share(self, plan: Plan) -> Any:
        """The plan as replicas receive it (a Ray executor puts it in the object store once)."""
        return plan

    # -- placement -----------------------------------------------------------------------------

    def _group(self, spec: Any, base_dir: Path | None) -> ReplicaGroup:
        key = group_key(spec, base_dir)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = ReplicaGroup(key, spec, base_dir, replicas=self.replicas.get(spec.name))
        group.grow(self.replicas.get(spec.name, spec.replicas))
        return group

    def host(self, group: ReplicaGroup, index: int) -> ReplicaHandle:
        """Replica `index` of `group`, started now if it is not running (or died)."""
        handle = self._hosts.get((group.key, index))
        if handle is None or handle.dead:
            handle = self._hosts[(group.key, index)] = self._start_host(group, index)
        return handle

    def _open(self, ctx: RunContext) -> _Run:
        run = self._runs.get(ctx.run_id)
        if run is None:
            base_dir = ctx.base_dir
            ticket = RunTicket(ctx.run_id, ctx.seed, None if base_dir is None else str(base_dir), self._share(ctx.plan))
            run = _Run(ticket, ctx.plan, base_dir, outputs_left=set(ctx.plan.outputs))
            sizes = {spec.name: self._group(spec, base_dir).size for spec in ctx.plan.models()}
            check_pins(self.pins, ctx.plan, sizes)
            self._runs[ctx.run_id] = run
        return run

    def _place(self, run: _Run, node: PlanNode) -> ReplicaHandle:
        group = self._group(node.model, run.base_dir)
        index = pinned(node.name, node.declared, self.pins)
        if index is None:
            index = run.replicas.get(group.key)
            if index is None:
                index = run.replicas[group.key] = group.choose()
                group.active[index] += 1
        handle = self.host(group, index)
        run.used[id(handle)] = handle
        return handle

    def _finish(self, run: _Run, node: str) -> None:
        run.outputs_left.discard(node)
        if not run.outputs_left:
            self._deactivate(run)

    def _deactivate(self, run: _Run) -> None:
        if run.active:
            run.active = False
            for key, index in run.replicas.items():
                self._groups[key].active[index] -= 1

    def preparing(self, plan: Plan) -> str:
        return f"starting {self.name} replicas of {', '.join(spec.name for spec in plan.models())}"

    async def prepare(self, plan: Plan, base_dir: Path | None = None) -> list[dict[str, str]]:
        """Start every replica the plan's models declare and load their models (before a run,
        so its timing shows the run, not the loading). Returns the hosts' placements."""
        targets = []
        for spec in plan.models():
            if spec.is_api:
                continue  # a server, not a replica to start
            group = self._group(spec, base_dir)
            targets.extend((self.host(group, index), spec) for index in range(group.size))
        async with anyio.create_task_group() as tasks:
            for handle, spec in targets:
                tasks.start_soon(self._warm, handle, spec, base_dir)
        return [dict(handle.placement) for handle, _ in targets]

    async def _warm(self, handle: ReplicaHandle, spec: Any, base_dir: Path | None) -> None:
        await self._guard(handle, None, handle.call("warm", spec, None if base_dir is None else str(base_dir)))

    async def fingerprints(self, plan: Plan, base_dir: Path | None = None) -> dict[str, str]:
        """Model name -> identity hash, computed by a replica (the scheduler loads no model)."""
        result = {}
        for spec in plan.models():
            if spec.is_api:
                result[spec.name] = load_api_model(model_key(spec, base_dir)).fingerprint
                continue
            handle = self.host(self._group(spec, base_dir), 0)
            base = None if base_dir is None else str(base_dir)
            result[spec.name] = await self._guard(handle, None, handle.call("fingerprint", spec, base))
        return result

    # -- the executor contract -----------------------------------------------------------------

    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
        run = self._open(ctx)
        if node.is_function:  # on the scheduler's side: no model to place, text in and out
            result = await run_function_node(ctx, node, inbound)
            self._finish(run, node.name)
            return result
        if node.model.is_api:  # a server answers; it needs no replica and leaves no state to hold
            result = await run_api_node(ctx, node, inbound)
            self._finish(run, node.name)
            return result
        host = self._place(run, node)
        content = compose_content(node, inbound)
        handoffs: dict[int, list[Any]] = {}
        crossing: dict[int, str] = {}  # edge id -> transport name
        for group in state_groups([edge for edge, _ in inbound]):
            senders = [self._sender(run, node, edge) for edge in group]
            if all(sender is host for sender in senders):
                continue
            lead = group[0]
            results = {edge.id: result for edge, result in inbound}
            labels = [sender_roles(results[edge.id], results[edge.id].positions) for edge in group]
            starts = [sender_span_starts(results[edge.id], results[edge.id].positions) for edge in group]
            known = (node.agent.system, content)
            with node_failed(node.name, lead):
                handles = await self._select(
                    run, ctx, host, node, group, senders, group_request(lead, content), known, labels, starts
                )
            handoffs[lead.id] = handles
            for edge, handle in zip(group, handles):
                crossing[edge.id] = handle.transport
        async def publish(kind: str, payload: dict[str, Any]) -> Any:
            if kind == "hop":  # where it ran, as the record's row will say (see _annotate)
                placement, crossed = self._where(run, host, payload["source"], payload["mode"], payload.get("edge"),
                                                 payload["payload_bytes"], crossing)
                payload = {**payload, "placement": placement, "crossed_bytes": crossed}
            return await ctx.publish(kind, payload)

        try:
            # the node itself travels (not its name): a run-time foreach copy carries the item it was given
            result, shape = await self._guard(host, node.name, host.run_node(run.ticket, node, inbound, handoffs,
                                                                              publish))
        except RemoteNodeFailure as failure:
            raise remote_failure(failure.info, run.plan) from None
        except anyio.get_cancelled_exc_class():
            host.stop(ctx.run_id)
            raise
        run.where[node.name] = host
        run.shapes[node.name] = shape
        self._finish(run, node.name)
        return self._annotate(run, host, result, crossing)

    def _sender(self, run: _Run, node: PlanNode, edge: PlanEdge) -> ReplicaHandle:
        sender = run.where.get(edge.source)
        if sender is None:
            raise NodeFailed(node.name, KeyError(f"no host holds the state of {edge.source!r}; resume restores it"), edge)
        return sender

    async def _select(
        self, run: _Run, ctx: RunContext, host: ReplicaHandle, node: PlanNode, group: list[PlanEdge],
        senders: list[ReplicaHandle], request: str, known: tuple[str, ...], roles: list[list[str]],
        span_starts: list[list[int]] | None = None,
    ) -> list[Any]:
        """Fit the group's counts here and select each sender on its own host, concurrently
        (`known` and `roles`: what the receiver holds and each sender's position labels;
        `span_starts`: where each sender's runs of rows begin)."""
        lead = group[0]
        options = transfer_options(lead.policy, trust_code=ctx.plan.trust_code, seed=ctx.seed)
        options = split_options(options, allocation_named=lead.policy.allocation_named)
        refuse_unmatched(options, edge=f"{lead.source!r} -> {node.name!r} ({lead.policy.label})", senders=len(group),
                         bridge_named=bool(lead.policy.bridge) and lead.policy.bridge_named)
        room = await self._guard(host, node.name, host.call("room", run.ticket, node.name, request))
        counts = fit_counts(options, [run.shapes[edge.source] for edge in group], room)
        handles: list[Any] = [None] * len(group)

        async def select(position: int) -> None:
            edge, sender = group[position], senders[position]
            handles[position] = await self._guard(
                sender, node.name,
                sender.call(
                    "select", run.ticket, edge.id, request, counts[position], sender is host, known, roles[position],
                    None if span_starts is None else span_starts[position],
                ),
                sender_of=edge.source,
            )

        if len(group) == 1:
            await select(0)
            return handles
        try:
            async with anyio.create_task_group() as tasks:
                for position in range(len(group)):
                    tasks.start_soon(select, position)
        except BaseExceptionGroup as errors:  # one sender's failure is the group's failure
            first = _first_error(errors)
            if first is None:
                raise
            raise first from None
        return handles

    def _annotate(self, run: _Run, host: ReplicaHandle, result: NodeResult, crossing: dict[int, str]) -> NodeResult:
        hops: list[HopRecord] = []
        for record in result.hops:
            placement, crossed = self._where(run, host, record.source, record.mode, record.edge, record.payload_bytes,
                                             crossing)
            hops.append(replace(record, placement=placement, crossed_bytes=crossed))
        return replace(result, hops=hops, placement=dict(host.placement))

    @staticmethod
    def _where(
        run: _Run, host: ReplicaHandle, source: str, mode: str, edge: int | None, payload_bytes: int,
        crossing: dict[int, str],
    ) -> tuple[dict[str, Any], int]:
        """A hop's placement (sender, receiver, transport) and the bytes that left the sender's machine."""
        sender = run.where.get(source)
        crossed = sender is not None and sender.placement.get("node") != host.placement.get("node")
        if mode == "text":
            transport = "text"
        else:
            transport = crossing.get(edge, "in_process") if edge is not None else "in_process"
        placement = {
            "sender": None if sender is None else dict(sender.placement),
            "receiver": dict(host.placement),
            "transport": transport,
        }
        return placement, payload_bytes if crossed else 0

    def agent(self, run_id: str, node: str) -> RemoteAgent | None:
        run = self._runs[run_id]
        if run.plan.node(node).model.is_api:
            return None
        proxy = RemoteAgent(self, run_id, run.plan.node(node), run.where[node])
        proxy.shape = run.shapes.get(node)
        return proxy

    def bind(self, ctx: RunContext, node: PlanNode) -> RemoteAgent:
        """An agent for `node` that is not placed yet; `load` restores it on its host (resume)."""
        self._open(ctx)
        return RemoteAgent(self, ctx.run_id, node)

    def adopt(self, run_id: str, node: str, agent: RemoteAgent) -> None:
        if not isinstance(agent, RemoteAgent) or agent.host is None or agent.shape is None:
            raise UsageError(
                f"agent: {self.name} executors adopt agents from their own bind() + load(); got {type(agent).__name__}"
            )
        run = self._runs[run_id]
        run.where[node] = agent.host
        run.shapes[node] = agent.shape
        self._finish(run, node)

    def release(self, run_id: str) -> None:
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        self._deactivate(run)
        hosts = {id(handle): handle for handle in run.where.values()} | run.used
        for handle in hosts.values():
            if not handle.dead:
                handle.release(run_id)

    def close(self) -> None:
        """Stop every host this executor started."""
        for run_id in list(self._runs):
            self.release(run_id)
        for handle in self._hosts.values():
            handle.close()
        self._hosts.clear()

    # -- errors --------------------------------------------------------------------------------

    async def _guard(self, host: ReplicaHandle, node: str | None, call: Any, *, sender_of: str | None = None) -> Any:
        """Await a host call; a dead host becomes HostDied naming the host and the node."""
        try:
            return await call
        except HostDied as error:
            role = f"the state of sender {sender_of!r} for node {node!r}" if sender_of else (
                f"node {node!r}" if node else "a model")
            raise HostDied(f"{error}; it held {role}. Resume the run to continue on a fresh host") from None


def _first_error(error: BaseException) -> Exception | None:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _first_error(inner)
            if found is not None:
                return found
        return None
    return error if isinstance(error, Exception) else None


def remote_failure(info: Mapping[str, Any], plan: Plan) -> NodeFailed:
    """Rebuild a host's NodeFailed from plain data (builtin exception types keep their type)."""
    kind = getattr(builtins, str(info.get("type")), None)
    message = str(info.get("message"))
    if isinstance(kind, type) and issubclass(kind, Exception) and kind.__module__ == "builtins":
        cause: Exception = kind(message)
    else:
        cause = RuntimeError(f"{info.get('type')}: {message}")
    edge = None if info.get("edge") is None else plan.edges[int(info["edge"])]
    return NodeFailed(str(info.get("node")), cause, edge)
