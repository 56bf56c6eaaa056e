"""The frozen `Plan` a scheduler executes: concrete nodes and edges, and the queries on them.

The plan is a DAG of concrete nodes (foreach copies `worker[0]`, loop rounds `a@2`, both
`worker[1]@3`) with rendered prompts and requests, resolved edge policies, a deterministic
topological order, each node's incoming edges in declaration order (the order handoffs
arrive at a fan-in), and the output nodes. The scheduler asks the plan what may run next
(`ready`, `ready_after`) and never re-derives graph structure itself; records describe it
(`describe`, `fingerprint`). compile.py builds plans.

Naming: `name[i]` is copy i of a foreach node, `name@r` is round r of a loop node, and
`sub/name` is node `name` of the subgraph that node `sub` runs (`sub[1]/name@2`: round 2 of
`name` in the subgraph of copy 1 of `sub`). A subgraph is spliced into its parent's plan
(compile.py, splice.py): its nodes are plan nodes like any other, `scope` says which
subgraph instance each belongs to and `Plan.scopes` describes the instances.

A run-time foreach node (`foreach: {node: planner}`) is planned as `max_items` copies whose
item is unknown until `planner` finished: `foreach_from` names the producer, the copy waits
for it (as for an edge), and the scheduler reads the copy's item from the producer's output
(`runtime_foreach.py`) before it runs the copy, or skips the copy past the list's end.

Conditional edges (`when`, and the edges an `until` loop stop decides, `LoopStop`) are
marked on the plan but decided at run time, from the outputs of finished nodes: a node
runs once everything its inbound edges wait for is *settled* (finished or skipped) and at
least one of them fired; a node none of whose edges fired is skipped (run/routing.py).
The queries here take the settled set, so they stay pure.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Collection, Mapping

import networkx as nx

from ..spec import predicates
from ..spec.models import AgentSpec, GraphSpec, ModelSpec, NodeSpec
from .policy import ResolvedPolicy


@dataclass(frozen=True)
class PlanNode:
    """One node the scheduler runs once."""

    name: str  # unique in the plan: "final", "worker[2]", "a@3"
    declared: str  # the spec node it came from
    agent: AgentSpec | None  # None for a function node
    model: ModelSpec | None  # None for a function node
    prompt: str  # rendered from the template with the run's inputs and node variables
    template: str
    generate: bool
    output: bool
    index: int | None  # foreach position
    round: int | None  # loop round, 1-based
    item: str | None  # the foreach item this copy reads
    incoming: tuple[int, ...]  # PlanEdge ids, in declaration order (handoff arrival order)
    outgoing: tuple[int, ...]
    call: str | None = None  # a function node's package.module:callable
    interrupt: str | None = None  # "before" | "after": the run stops there for a person's answer
    question: str | None = None  # what the person is asked (rendered), for interrupt nodes
    answer: str | None = None  # the person's answer, when the run was given one
    # Character spans of `prompt` that hold rendered values (inputs, node variables); the
    # rest is the template's own text (what receiver-aware selection calls instructions).
    prompt_values: tuple[tuple[int, int], ...] = ()
    # The JSON Schema the node's output must match (`output_schema:`): constrained decoding,
    # then validation; None for free text.
    output_schema: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    scope: str = ""  # the subgraph instance this node belongs to ("" at the top, "research", "a[0]/b")
    foreach_from: str | None = None  # run-time foreach: the plan node whose JSON list gives this copy's item
    spec_path: tuple[str | int, ...] = ()  # where its spec node is written: ("nodes", 2, "graph", "nodes", 0)

    @property
    def is_function(self) -> bool:
        """Whether a Python callable runs this node instead of an agent."""
        return self.call is not None

    def sampling_seed(self, run_seed: int) -> int:
        """The seed this node samples with: its agent's `seed`, else one derived from the run's
        seed and the node's name (so every node of a run, and every rerun, differs yet repeats)."""
        if self.agent is not None and self.agent.seed is not None:
            return self.agent.seed
        digest = hashlib.sha256(f"{run_seed}:{self.name}".encode()).digest()
        return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class LoopStop:
    """How a loop that may stop early (`until`) decides one edge: after round `round`, the
    until condition is read on node `check`'s output. A loop edge into round + 1 fires while
    the loop goes on (the condition did not hold); an edge leaving the loop from `round`
    (`exits`) fires when the loop stopped there (it held)."""

    check: str  # plan node whose output the condition reads, e.g. "critic@2"
    until: Any  # the condition (spec/predicates.py) or a router reference
    round: int
    exits: bool

    def describe(self) -> dict[str, Any]:
        """Plain JSON data (plan descriptions and records)."""
        return {"check": self.check, "until": predicates.describe(self.until), "round": self.round, "exits": self.exits}


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
    when: Any = None  # the edge's own condition on its source's output (spec/predicates.py), or None
    stop: LoopStop | None = None  # set on edges an `until` loop stop decides
    spec_path: tuple[str | int, ...] = ()  # where its spec edge is written: ("edges", 3), or inside a subgraph
    routes_to: str = ""  # the target's name as the spec edge writes it (what a router names), "" for `declared`

    @property
    def key(self) -> str:
        """"source->target": the edge's name in records (`fired`); a plan has one edge per pair."""
        return f"{self.source}->{self.target}"

    @property
    def conditional(self) -> bool:
        """Whether the edge may not fire although its source finished (decided at run time)."""
        return self.when is not None or self.stop is not None

    @property
    def waits_for(self) -> tuple[str, ...]:
        """The nodes that must be settled before this edge is decided: its source, and the
        node whose output stops the loop, when a loop stop decides it."""
        if self.stop is None or self.stop.check == self.source:
            return (self.source,)
        return (self.source, self.stop.check)


@dataclass(frozen=True)
class Scope:
    """One instance of a subgraph in a plan: subgraph node `node` (its declared path) run as
    `name` ("research", "research[0]", "outer/inner"), with the subgraph's own inputs; edges
    into the instance reach `entries`, and `returns` is the plan node whose output (and, on
    state edges, state) is the instance's."""

    name: str
    node: str
    graph: str  # the subgraph topology's name
    inputs: Mapping[str, Any]
    returns: str
    entries: tuple[str, ...]
    spec_path: tuple[str | int, ...]

    def describe(self) -> dict[str, Any]:
        """Plain JSON data (plan descriptions and records)."""
        return {"name": self.name, "node": self.node, "graph": self.graph, "returns": self.returns,
                "entries": list(self.entries),
                "inputs": {key: list(value) if isinstance(value, tuple) else value for key, value in self.inputs.items()}}


@dataclass(frozen=True)
class _Wiring:
    waits_for: Mapping[str, tuple[str, ...]]  # per node: every node its inbound edges wait for
    followers: Mapping[str, tuple[str, ...]]  # per node: the nodes that wait for it, in plan order


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
    # callables handed over in Python for function nodes, by `call` reference (not part of the
    # fingerprint: the spec names them)
    functions: Mapping[str, Callable[..., Any]] = field(repr=False, compare=False, default_factory=dict)
    # subgraph instances by name; the key each output node's text is reported under (a subgraph's
    # returned node answers as its subgraph node); where edges into this plan and out of its
    # declared output nodes attach (a plan spliced into a parent as a subgraph)
    scopes: Mapping[str, Scope] = field(default_factory=dict)
    output_keys: Mapping[str, str] = field(default_factory=dict)
    entries: tuple[str, ...] = ()
    exits: Mapping[str, str] = field(repr=False, default_factory=dict)

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

    def output_key(self, name: str) -> str:
        """The name output node `name`'s text is reported under: the node's own, or the
        subgraph node whose subgraph it returns from ("research" for "research/answer")."""
        return self.output_keys.get(name, name)

    def scope_inputs(self, scope: str) -> Mapping[str, Any]:
        """The inputs the nodes of subgraph instance `scope` read ("" : the run's inputs)."""
        return self.inputs if not scope else self.scopes[scope].inputs

    def spec_node(self, node: PlanNode) -> NodeSpec:
        """The spec node `node` was planned from (inside its subgraph, if it has one)."""
        parts = list(node.spec_path) or ["nodes", next(i for i, item in enumerate(self.spec.nodes) if item.name == node.declared)]
        spec: Any = self.spec
        found: Any = None
        while parts:
            kind = parts.pop(0)
            if kind == "nodes":
                found = spec.nodes[parts.pop(0)]
            else:  # "graph": into the subgraph of the node just found
                spec = found.graph
        return found

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

    def ready(self, settled: Collection[str], started: Collection[str] = ()) -> tuple[str, ...]:
        """Nodes not yet started whose inbound edges can all be decided (everything they wait
        for is settled: finished or skipped), in plan order.

        The scheduler's whole planning step: call it after every node settles. Whether a ready
        node runs or is skipped is then decided from its fired edges (`run/routing.py`); in a
        plan without conditions, settled means finished and every ready node runs.
        """
        done = set(settled)
        begun = set(started) | done
        waits = self._wiring.waits_for
        return tuple(
            node.name for node in self.nodes if node.name not in begun and all(name in done for name in waits[node.name])
        )

    def ready_after(
        self, name: str, settled: Collection[str], started: Collection[str] = ()
    ) -> tuple[str, ...]:
        """The nodes that `name` settling made ready: those waiting for it, not yet started or
        settled, everything else they wait for settled (`settled` already includes `name`),
        in plan order.

        The incremental form of `ready()`: a scheduler that starts everything `ready()`
        returns, then calls this after each node settles, starts exactly the same nodes, but
        a chain of n nodes costs O(n) planning instead of O(n^2).
        """
        if name not in self._index:
            raise KeyError(f"node {name!r} is not in plan {self.name!r}")
        wiring = self._wiring
        return tuple(
            follower
            for follower in wiring.followers[name]
            if follower not in started
            and follower not in settled
            and all(other in settled for other in wiring.waits_for[follower])
        )

    @functools.cached_property
    def _wiring(self) -> _Wiring:
        """What each node waits for, and who waits for it (in plan order), computed once."""
        waits: dict[str, tuple[str, ...]] = {}
        followers: dict[str, list[str]] = {node.name: [] for node in self.nodes}
        for node in self.nodes:
            producer = () if node.foreach_from is None else (node.foreach_from,)
            waits[node.name] = tuple(dict.fromkeys(
                [name for edge in node.incoming for name in self.edges[edge].waits_for] + list(producer)
            ))
            for name in waits[node.name]:
                followers[name].append(node.name)  # plan order: nodes are visited in order
        return _Wiring(MappingProxyType(waits), MappingProxyType({k: tuple(v) for k, v in followers.items()}))

    def conditional(self) -> bool:
        """Whether any edge of the plan is decided at run time (`when` or a loop stop)."""
        return any(edge.conditional for edge in self.edges)

    def answers(self) -> dict[str, str]:
        """The answers the run was given, by node (`compile_plan(..., answers=...)`)."""
        return {node.name: node.answer for node in self.nodes if node.answer is not None}

    def models(self) -> tuple[ModelSpec, ...]:
        """Models the plan uses, in first-use order (what a model pool must load)."""
        seen: dict[str, ModelSpec] = {}
        for node in self.nodes:
            if node.model is not None:
                seen.setdefault(node.model.name, node.model)
        return tuple(seen.values())

    def fingerprint(self) -> str:
        """sha256 of the spec and the inputs: equal plans, equal fingerprints. A run record
        stores it so a resumed run can refuse a changed graph or changed inputs."""
        spec = self.spec.model_dump(mode="json")
        if not spec.get("mcp_servers"):  # a field added later: a graph without servers keeps its fingerprint
            spec.pop("mcp_servers", None)
        data = {
            "spec": spec,
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
                    "agent": None if node.agent is None else node.agent.name,
                    "model": None if node.model is None else node.model.name,
                    "call": node.call,
                    "interrupt": node.interrupt,
                    "question": node.question,
                    "generate": node.generate,
                    "output": node.output,
                    "index": node.index,
                    "round": node.round,
                    "senders": list(self.senders(node.name)),
                    "scope": node.scope,
                    "foreach_from": node.foreach_from,
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
                    "when": predicates.describe(edge.when),
                    "stop": None if edge.stop is None else edge.stop.describe(),
                }
                for edge in self.edges
            ],
            "levels": [list(level) for level in self.levels()],
            "outputs": list(self.outputs),
            "output_keys": {name: self.output_key(name) for name in self.outputs},
            "subgraphs": [scope.describe() for scope in self.scopes.values()],
        }
