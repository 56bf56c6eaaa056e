"""The frozen `Plan` a scheduler executes: concrete nodes and edges, and the queries on them.

The plan is a DAG of concrete nodes (foreach copies `worker[0]`, loop rounds `a@2`, both
`worker[1]@3`) with rendered prompts and requests, resolved edge policies, a deterministic
topological order, each node's incoming edges in declaration order (the order handoffs
arrive at a fan-in), and the output nodes. The scheduler asks the plan what may run next
(`ready`, `ready_after`) and never re-derives graph structure itself; records describe it
(`describe`, `fingerprint`). compile.py builds plans.

Naming: `name[i]` is copy i of a foreach node, `name@r` is round r of a loop node.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Collection, Mapping

import networkx as nx

from ..spec.models import AgentSpec, GraphSpec, ModelSpec
from .policy import ResolvedPolicy


@dataclass(frozen=True)
class PlanNode:
    """One node the scheduler runs once."""

    name: str  # unique in the plan: "final", "worker[2]", "a@3"
    declared: str  # the spec node it came from
    agent: AgentSpec
    model: ModelSpec
    prompt: str  # rendered from the template with the run's inputs and node variables
    template: str
    generate: bool
    output: bool
    index: int | None  # foreach position
    round: int | None  # loop round, 1-based
    item: str | None  # the foreach item this copy reads
    incoming: tuple[int, ...]  # PlanEdge ids, in declaration order (handoff arrival order)
    outgoing: tuple[int, ...]
    # Character spans of `prompt` that hold rendered values (inputs, node variables); the
    # rest is the template's own text (what receiver-aware selection calls instructions).
    prompt_values: tuple[tuple[int, int], ...] = ()

    def sampling_seed(self, run_seed: int) -> int:
        """The seed this node samples with: its agent's `seed`, else one derived from the run's
        seed and the node's name (so every node of a run, and every rerun, differs yet repeats)."""
        if self.agent.seed is not None:
            return self.agent.seed
        digest = hashlib.sha256(f"{run_seed}:{self.name}".encode()).digest()
        return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class PlanEdge:
    """One handoff between two concrete nodes, with its resolved policy and rendered request."""

    id: int  # position in Plan.edges
    source: str
    target: str
    declared: int  # index into spec.edges
    policy: ResolvedPolicy
    request: str | None  # rendered request, None: use the receiver's prompt
    loop: bool  # a loop edge (round r -> r + 1)


@dataclass(frozen=True)
class _Wiring:
    senders: Mapping[str, tuple[str, ...]]
    receivers: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Plan:
    """A topology expanded over one run's inputs: a frozen DAG of concrete nodes and edges
    that the scheduler walks (`ready`, `ready_after`) and records describe (`describe`,
    `fingerprint`). Build one with `compile_plan` or `Graph.plan`."""

    name: str
    spec: GraphSpec
    trust_code: bool
    inputs: Mapping[str, Any]  # every declared input, defaults filled; lists as tuples
    nodes: tuple[PlanNode, ...]  # deterministic topological order
    edges: tuple[PlanEdge, ...]  # declaration order
    outputs: tuple[str, ...]  # in topological order
    _index: Mapping[str, int] = field(repr=False, compare=False, default_factory=dict)
    _levels: tuple[tuple[str, ...], ...] = field(repr=False, compare=False, default=())

    @property
    def order(self) -> tuple[str, ...]:
        """Node names in the plan's deterministic topological order."""
        return tuple(node.name for node in self.nodes)

    def node(self, name: str) -> PlanNode:
        """The node called `name` (KeyError naming the plan otherwise)."""
        try:
            return self.nodes[self._index[name]]
        except KeyError:
            raise KeyError(f"node {name!r} is not in plan {self.name!r}") from None

    def incoming(self, name: str) -> tuple[PlanEdge, ...]:
        """Edges into `name` in declaration order: the order its handoffs arrive."""
        return tuple(self.edges[edge] for edge in self.node(name).incoming)

    def outgoing(self, name: str) -> tuple[PlanEdge, ...]:
        """Edges out of `name`, in declaration order."""
        return tuple(self.edges[edge] for edge in self.node(name).outgoing)

    def senders(self, name: str) -> tuple[str, ...]:
        """The nodes `name` receives from, in arrival order (one per edge)."""
        return tuple(edge.source for edge in self.incoming(name))

    def receivers(self, name: str) -> tuple[str, ...]:
        """The nodes `name` hands over to, one per outgoing edge."""
        return tuple(edge.target for edge in self.outgoing(name))

    def roots(self) -> tuple[str, ...]:
        """Nodes without senders: the ones a run starts with."""
        return tuple(node.name for node in self.nodes if not node.incoming)

    def levels(self) -> tuple[tuple[str, ...], ...]:
        """Nodes grouped by depth: a node's senders all sit in earlier levels, so the nodes of
        one level are independent branches that may run concurrently."""
        return self._levels

    def ready(self, finished: Collection[str], started: Collection[str] = ()) -> tuple[str, ...]:
        """Nodes not yet started whose senders have all finished, in plan order.

        The scheduler's whole planning step: call it after every completion.
        """
        done = set(finished)
        begun = set(started) | done
        return tuple(
            node.name
            for node in self.nodes
            if node.name not in begun and all(self.edges[edge].source in done for edge in node.incoming)
        )

    def ready_after(
        self, name: str, finished: Collection[str], started: Collection[str] = ()
    ) -> tuple[str, ...]:
        """The nodes that `name` finishing made ready: its receivers, not yet started, whose
        senders have all finished (`finished` already includes `name`), in plan order.

        The incremental form of `ready()`: a scheduler that starts everything `ready()`
        returns, then calls this after each completion, starts exactly the same nodes, but
        a chain of n nodes costs O(n) planning instead of O(n^2).
        """
        if name not in self._index:
            raise KeyError(f"node {name!r} is not in plan {self.name!r}")
        wiring = self._wiring
        return tuple(
            receiver
            for receiver in wiring.receivers[name]
            if receiver not in started
            and receiver not in finished
            and all(sender in finished for sender in wiring.senders[receiver])
        )

    @functools.cached_property
    def _wiring(self) -> _Wiring:
        """Distinct senders and receivers per node (receivers in plan order), computed once."""
        senders: dict[str, tuple[str, ...]] = {}
        receivers: dict[str, list[str]] = {node.name: [] for node in self.nodes}
        for node in self.nodes:
            senders[node.name] = tuple(dict.fromkeys(self.edges[edge].source for edge in node.incoming))
            for sender in senders[node.name]:
                receivers[sender].append(node.name)  # plan order: nodes are visited in order
        return _Wiring(MappingProxyType(senders), MappingProxyType({k: tuple(v) for k, v in receivers.items()}))

    def models(self) -> tuple[ModelSpec, ...]:
        """Models the plan uses, in first-use order (what a model pool must load)."""
        seen: dict[str, ModelSpec] = {}
        for node in self.nodes:
            seen.setdefault(node.model.name, node.model)
        return tuple(seen.values())

    def fingerprint(self) -> str:
        """sha256 of the spec and the inputs: equal plans, equal fingerprints. A run record
        stores it so a resumed run can refuse a changed graph or changed inputs."""
        data = {
            "spec": self.spec.model_dump(mode="json"),
            "inputs": {key: list(value) if isinstance(value, tuple) else value for key, value in self.inputs.items()},
            "trust_code": self.trust_code,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def graph(self) -> nx.DiGraph:
        """A fresh networkx copy (nodes carry `declared`, edges carry `id` and `mode`)."""
        graph = nx.DiGraph(name=self.name)
        for node in self.nodes:
            graph.add_node(node.name, declared=node.declared, output=node.output, generate=node.generate)
        for edge in self.edges:
            graph.add_edge(edge.source, edge.target, id=edge.id, mode=edge.policy.mode, label=edge.policy.label)
        return graph

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable summary (for `rclc-graph validate --json` and run records)."""
        return {
            "name": self.name,
            "inputs": {key: list(value) if isinstance(value, tuple) else value for key, value in self.inputs.items()},
            "nodes": [
                {
                    "name": node.name,
                    "declared": node.declared,
                    "agent": node.agent.name,
                    "model": node.model.name,
                    "generate": node.generate,
                    "output": node.output,
                    "index": node.index,
                    "round": node.round,
                    "senders": list(self.senders(node.name)),
                }
                for node in self.nodes
            ],
            "edges": [
                {
                    "id": edge.id,
                    "source": edge.source,
                    "target": edge.target,
                    "declared": edge.declared,
                    "loop": edge.loop,
                    "request": edge.request,
                    "policy": edge.policy.to_dict(),
                }
                for edge in self.edges
            ],
            "levels": [list(level) for level in self.levels()],
            "outputs": list(self.outputs),
        }
