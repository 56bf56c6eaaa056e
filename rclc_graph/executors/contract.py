"""The executor contract: everything the scheduler, records, resume and the CLI ask of the
thing that runs nodes, in one abstract base class.

Where a node runs is the executor's business (in this process, on Ray actors, nowhere at all
in tests); who calls what is fixed here. Every executor implements every method, so callers
never probe with `hasattr`: an executor that cannot do something says so by raising
NotImplementedError from that method. `DelegatingExecutor` forwards the whole contract to
another executor, for wrappers that change one step (recording, fault injection in tests).

`RunContext` is what one node learns about its run; `Publish` is how it emits events.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..plan.dag import Plan, PlanEdge, PlanNode
from ..results.run_result import NodeResult
from ..errors import UsageError

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""`await publish(kind, payload)`: emit one event of the run (kinds in results.events.KINDS)."""

Inbound = list[tuple[PlanEdge, NodeResult]]
"""A node's incoming edges that fired, with their senders' results, in arrival (declaration) order."""


@dataclass
class RunContext:
    """What a node needs to know about the run it belongs to."""

    run_id: str
    plan: Plan
    publish: Publish
    seed: int = 0
    base_dir: Path | None = None
    stop: threading.Event = field(default_factory=threading.Event)  # set when the run is cancelled
    # the run's MCP servers (mcp_servers.McpServers), opened by the scheduler around the run;
    # None where a node runs outside it (a replica opens its own around the node)
    tool_servers: Any = None


class Executor(ABC):
    """Runs plan nodes and holds the state they leave, for one or more concurrent runs.

    `name` names the executor in records, errors and the CLI ("local", "ray", ...).
    """

    name: str

    @abstractmethod
    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
        """Run one node. Called by the scheduler, in the node's own task, once every sender of
        the node settled and at least one inbound edge fired; `inbound` holds the fired edges
        only. A function node (`node.is_function`) runs through `function_node.run_function_node`
        wherever the executor's scheduler side is; it may raise `Interrupt`, which passes
        through. Raises NodeFailed naming the node and edge (any other exception is wrapped by
        the scheduler); a cancelled run cancels this call. Publishes, through `ctx.publish`, a
        `hop` event (`results.run_events.hop_payload`) for each handoff as soon as the node
        holds it, before it generates, and its `token` events; the scheduler publishes any hop
        an executor left out once the node finished."""

    @abstractmethod
    def agent(self, run_id: str, node: str) -> Any | None:
        """The agent state node `node` left in run `run_id`, with `await save(path)` writing its
        snapshot. Called by records right after `run_node` returns. None when this executor
        keeps no agent state (records are then written without snapshots); KeyError for a
        node it should hold but does not."""

    @abstractmethod
    def bind(self, ctx: RunContext, node: PlanNode) -> Any:
        """A fresh agent for `node`, into which `await agent.load(path)` restores a snapshot.
        Called by resume before the run continues; NotImplementedError when this executor
        cannot restore state."""

    @abstractmethod
    def adopt(self, run_id: str, node: str, agent: Any) -> None:
        """Make `agent` (from `bind` + `load`) node `node`'s state in run `run_id`, as if the
        node had run here. Called by resume; NotImplementedError as for `bind`."""

    @abstractmethod
    def release(self, run_id: str) -> None:
        """Forget a run: drop its agents and whatever else it holds. Called by the scheduler
        when a run fails or is cancelled, and by callers done with a finished run."""

    def consumed(self, run_id: str, node: str) -> None:
        """Every receiver of `node` in run `run_id` has settled (or it has none): the run
        needs its state no more. Called by the scheduler; an executor may drop the state
        now (`LocalExecutor(keep_agents=False)` does), so a run holds the states its
        unfinished receivers still read, not every state it made. Does nothing by default."""

    @abstractmethod
    async def prepare(self, plan: Plan, base_dir: Path | None = None) -> list[dict[str, str]]:
        """Load the plan's models (start replicas) before a run, so its timing shows the run.
        Called by the CLI and by benchmarks. Returns where each replica runs ({"replica",
        "node", ...}); [] when models live in this process."""

    def preparing(self, plan: Plan) -> str:
        """What `prepare` is about to do for `plan`, as a status line says it."""
        return ", ".join(f"loading model {spec.name} ({spec.source})" for spec in plan.models())

    @abstractmethod
    async def fingerprints(self, plan: Plan, base_dir: Path | None = None) -> dict[str, str]:
        """Model name -> identity hash (weights, configuration, vocabulary) of each model the
        plan uses, as this executor loads it (loading it if needed)."""

    @abstractmethod
    def close(self) -> None:
        """Stop what this executor started (replicas, Ray) and drop every run. Called by
        whoever made the executor, e.g. `run_plan` for an executor it made from a name."""


def require_executor(value: Any, field_name: str = "executor") -> Executor:
    """`value` when it implements the contract, else ValueError naming the field and the fix."""
    if not isinstance(value, Executor):
        raise UsageError(
            f"{field_name}: {type(value).__name__} is not an executor; subclass rclc_graph.executors.Executor "
            "(or DelegatingExecutor to wrap one), or pass a name such as 'local'"
        )
    return value


class DelegatingExecutor(Executor):
    """Forwards the whole contract to `inner`; subclasses override the steps they change."""

    def __init__(self, inner: Executor) -> None:
        self.inner = require_executor(inner, "inner")
        self.name = inner.name

    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
        return await self.inner.run_node(ctx, node, inbound)

    def agent(self, run_id: str, node: str) -> Any | None:
        return self.inner.agent(run_id, node)

    def bind(self, ctx: RunContext, node: PlanNode) -> Any:
        return self.inner.bind(ctx, node)

    def adopt(self, run_id: str, node: str, agent: Any) -> None:
        self.inner.adopt(run_id, node, agent)

    def release(self, run_id: str) -> None:
        self.inner.release(run_id)

    def consumed(self, run_id: str, node: str) -> None:
        self.inner.consumed(run_id, node)

    async def prepare(self, plan: Plan, base_dir: Path | None = None) -> list[dict[str, str]]:
        return await self.inner.prepare(plan, base_dir)

    def preparing(self, plan: Plan) -> str:
        return self.inner.preparing(plan)

    async def fingerprints(self, plan: Plan, base_dir: Path | None = None) -> dict[str, str]:
        return await self.inner.fingerprints(plan, base_dir)

    def close(self) -> None:
        self.inner.close()
