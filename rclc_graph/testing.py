"""Small real executors for tests: the whole executor contract, without a model or without Ray.

- `FakeExecutor` runs nodes without any model. It composes each node's prompt as the local
  executor does, "tokenizes" it into words, keeps a deterministic choice of each sender's
  positions on state/full edges, and builds real lineage and hop records from that, so the
  scheduler, records, reports, the CLI and experiments run exactly as they do on a model.
  Texts, kept positions, failures and delays are configurable.
- `InProcessReplicasExecutor` runs the remote executor's placement, budget fitting and
  payload transport with several replicas as objects in this process: what runs across
  machines on Ray, testable on one process and a tiny model.

Nothing in the library imports this module (an import-linter contract checks it).
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import anyio

from .errors import HostDied
from .executors.contract import Executor, Inbound, RunContext
from .executors.function_node import run_function_node
from .executors.placement import ReplicaGroup, group_label
from .executors.pool import ModelPool
from .executors.prompts import compose_content
from .executors.remote import RemoteExecutor, ReplicaHandle
from .executors.replica import Replica
from .plan.dag import Plan, PlanEdge, PlanNode
from .results.lineage import Hop, Lineage, compose_hop
from .results.run_events import hop_payload
from .results.run_result import NodeResult

_WORD = re.compile(r"\S+\s*")


def word_offsets(text: str) -> list[tuple[int, int]]:
    """The fake tokenizer: one token per word, its span covering the word and the white space
    after it (so the spans tile the text, as a real tokenizer's offsets do)."""
    return [match.span() for match in _WORD.finditer(text)]


def every_other_position(edge: PlanEdge, sender: NodeResult) -> Sequence[int]:
    """The default selection: positions 0, 2, 4, ... of the sender's state."""
    return range(0, len(sender.lineage), 2)


@dataclass(frozen=True)
class NodeReading:
    """What a fake generating node has read when it is asked for its text."""

    node: PlanNode
    inbound: Inbound
    state: NodeResult  # the node's state before generating: prompt, lineage, the hops it received
    earlier: Mapping[str, NodeResult]  # every node of the run that finished before it (and the inbound senders)


def _default_text(reading: NodeReading) -> str:
    return f"answer of {reading.node.name}"


class FakeExecutor(Executor):
    """Runs nodes without a model (see the module docstring).

    - `text(reading)` is a generating node's output (default "answer of NAME"); a node with
      `generate: false` has none. It generates one token per word of its text.
    - `keep(edge, sender)` are the sender positions a state/full edge keeps (default every
      other position); each kept position counts `bytes_per_position` payload bytes.
    - `delays` holds seconds a node takes (before it fails, too).
    - `fail`: node names that raise RuntimeError("NAME broke"), or a function returning the
      exception a node raises (None: it does not fail).
    - `hang` names a node that never finishes; with `interrupt`, this process receives
      SIGINT 0.05 s after that node started, as Ctrl-C would send it.

    It keeps no agent state: `agent()` is None (records are written without snapshots), and
    `bind`/`adopt` raise NotImplementedError. `log` lists ("start", node, senders) and
    ("end", node, []) in order; `running` and `peak` count nodes running at once; `released`
    lists released runs.
    """

    name = "fake"

    def __init__(
        self,
        *,
        text: Callable[[NodeReading], str] = _default_text,
        keep: Callable[[PlanEdge, NodeResult], Sequence[int]] = every_other_position,
        delays: Mapping[str, float] | None = None,
        fail: Collection[str] | Callable[[PlanNode], BaseException | None] = (),
        hang: str | None = None,
        interrupt: bool = False,
        bytes_per_position: int = 8,
        selection_seconds: float = 0.001,
        generation_seconds: float = 0.002,
    ) -> None:
        self.text, self.keep = text, keep
        self.delays = dict(delays or {})
        self.fail = fail
        self.hang, self.interrupt = hang, interrupt
        self.bytes_per_position = bytes_per_position
        self.selection_seconds, self.generation_seconds = selection_seconds, generation_seconds
        self.log: list[tuple[str, str, list[str]]] = []
        self.running = 0
        self.peak = 0
        self.released: list[str] = []
        self._results: dict[str, dict[str, NodeResult]] = {}

    # -- running -----------------------------------------------------------------------------

    async def run_node(self, ctx: RunContext, node: PlanNode, inbound: Inbound) -> NodeResult:
        if node.is_function:  # a function needs no model: it runs for real, as on any executor
            result = await run_function_node(ctx, node, inbound)
            self._results.setdefault(ctx.run_id, {})[node.name] = result
            return result
        self.log.append(("start", node.name, [edge.source for edge, _ in inbound]))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            started = time.time()
            hops = [self._hop(node, edge, sender) for edge, sender in inbound]
            for hop in hops:  # delivered before the node "generates", as the local executor does
                await ctx.publish("hop", hop_payload(hop))
            if node.name == self.hang:
                if self.interrupt:
                    await anyio.sleep(0.05)
                    os.kill(os.getpid(), signal.SIGINT)
                await anyio.sleep_forever()
            await anyio.sleep(self.delays.get(node.name, 0))
            failure = self._failure(node)
            if failure is not None:
                raise failure
            result = self._result(ctx, node, inbound, started, hops)
        finally:
            self.running -= 1
        self.log.append(("end", node.name, []))
        self._results.setdefault(ctx.run_id, {})[node.name] = result
        return result

    def _failure(self, node: PlanNode) -> BaseException | None:
        if callable(self.fail):
            return self.fail(node)
        return RuntimeError(f"{node.name} broke") if node.name in self.fail else None

    def _result(self, ctx: RunContext, node: PlanNode, inbound: Inbound, started: float, hops: list[Hop]) -> NodeResult:
        states = [hop for hop in hops if hop.record.mode != "text"]
        inherited = sum(hop.record.kept_positions for hop in states)
        prompt = compose_content(node, inbound)
        offsets = word_offsets(prompt)
        read = Lineage.join([hop.lineage for hop in states]).extend(node.name, len(offsets), "prompt")
        state = NodeResult(node=node.name, text=None, positions=len(read), inherited_positions=inherited, lineage=read,
                           prompt_text=prompt, prompt_start=inherited, prompt_offsets=offsets,
                           hops=[hop.record for hop in hops])
        if not node.generate:
            return replace(state, started_at=started, finished_at=time.time())
        earlier = {**self._results.get(ctx.run_id, {}), **{sender.node: sender for _, sender in inbound}}
        text = self.text(NodeReading(node, inbound, state, earlier))
        generated = len(word_offsets(text))
        lineage = read.extend(node.name, generated, "token")
        records = [record if record.mode == "text" else replace(record, generation_seconds=self.generation_seconds)
                   for record in state.hops]  # as the local executor records a state hop's receiver generation
        return replace(state, text=text, positions=len(lineage), lineage=lineage, generated_tokens=generated,
                       generation_seconds=self.generation_seconds, started_at=started, finished_at=time.time(),
                       hops=records)

    def _hop(self, node: PlanNode, edge: PlanEdge, sender: NodeResult) -> Hop:
        if edge.policy.mode == "text":
            return compose_hop(Lineage(), [], source=edge.source, target=node.name, inherited_positions=0, budget=0,
                               payload_bytes=len(sender.effective_text.encode("utf-8")), mode="text", policy="text",
                               edge=edge.id)
        kept = list(self.keep(edge, sender))
        return compose_hop(sender.lineage, kept, source=edge.source, target=node.name,
                           inherited_positions=sender.inherited_positions, budget=len(kept),
                           payload_bytes=self.bytes_per_position * len(kept), mode=edge.policy.mode,
                           policy=edge.policy.label, edge=edge.id, selection_seconds=self.selection_seconds)

    # -- state -------------------------------------------------------------------------------

    def agent(self, run_id: str, node: str) -> None:
        """None: a fake node leaves no model state, so records have no snapshots."""
        return None

    def bind(self, ctx: RunContext, node: PlanNode) -> Any:
        raise NotImplementedError(
            "executor 'fake' keeps no agent state, so it cannot restore one; resume with a model-backed executor"
        )

    def adopt(self, run_id: str, node: str, agent: Any) -> None:
        raise NotImplementedError(
            "executor 'fake' keeps no agent state, so it cannot adopt one; resume with a model-backed executor"
        )

    def release(self, run_id: str) -> None:
        self.released.append(run_id)
        self._results.pop(run_id, None)

    async def prepare(self, plan: Plan, base_dir: Path | None = None) -> list[dict[str, str]]:
        """Nothing to load."""
        return []

    async def fingerprints(self, plan: Plan, base_dir: Path | None = None) -> dict[str, str]:
        """A stand-in identity per model: "fake:" and its name."""
        return {spec.name: f"fake:{spec.name}" for spec in plan.models()}

    def close(self) -> None:
        self._results.clear()


# -- several replicas in this process -----------------------------------------------------------


class _InProcessReplicaHandle:
    """A Replica in this process standing in for a separate machine."""

    def __init__(self, replica: Replica, index: int) -> None:
        self.replica = replica
        self.dead = False
        self.placement = {"replica": replica.label, "actor": f"in-process-{id(replica):x}", "node": f"in-process-{index}"}

    async def call(self, method: str, *args: Any) -> Any:
        if self.dead:
            raise HostDied(f"replica {self.replica.label} was stopped")
        result = getattr(self.replica, method)(*args)
        return await result if inspect.isawaitable(result) else result

    async def run_node(self, ticket: Any, node: PlanNode, inbound: Inbound, refs: dict[int, list[Any]], publish: Any) -> Any:
        if self.dead:
            raise HostDied(f"replica {self.replica.label} was stopped")
        return await self.replica.execute(ticket, node, inbound, refs, publish)

    def stop(self, run_id: str) -> None:
        self.replica.stop(run_id)

    def release(self, run_id: str) -> None:
        self.replica.release(run_id)

    def close(self) -> None:
        self.dead = True


class InProcessReplicasExecutor(RemoteExecutor):
    """Replicas as objects in this process, sharing `pool`'s models; payloads between replicas
    travel as bytes, so placement, fitting and transport run exactly as across machines.
    `started` counts replicas started (fresh ones after `kill` included)."""

    name = "in-process-replicas"

    def __init__(
        self, pool: ModelPool, *, pins: Mapping[str, int] | None = None, replicas: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(pins=pins, replicas=replicas)
        self.pool = pool
        self.started = 0

    def _start_host(self, group: ReplicaGroup, index: int) -> ReplicaHandle:
        self.started += 1
        return _InProcessReplicaHandle(Replica(group_label(group.spec, index), pool=self.pool), self.started)

    def kill(self, replica: str) -> None:
        """Stop replica `replica` ("base#1"), as if its machine died."""
        for handle in self._hosts.values():
            if handle.placement["replica"] == replica and not handle.dead:
                handle.close()
