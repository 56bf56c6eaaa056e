"""Run-time decisions of conditional edges: which fired, and so which nodes run or are skipped.

The plan marks edges conditional (`when`, or a loop stop from `until`) and says what each
edge waits for (`PlanEdge.waits_for`); this module decides them once those nodes settled:

- an edge fires when its source finished, its loop stop (if any) lets it through, and its
  own `when` (if any) holds on the text its source's receivers read;
- a loop edge into round r + 1 lets through while the loop goes on: the until condition did
  not hold on the check node's output of round r; an edge leaving the loop from round r lets
  through when it stopped there (the condition held, or the check node was skipped, which
  leaves no verdict to go on with);
- a node with inbound edges runs when at least one fired, and is skipped otherwise, with a
  short reason; nodes without inbound edges always run;
- a copy of a run-time foreach node (`PlanNode.foreach_from`) runs only when its producer
  finished and wrote a list reaching its index: it is skipped past the list's end (or when
  the producer was skipped), and a list that is not a JSON list of strings within the node's
  `max_items` fails the copy (plan/runtime_foreach.py says what the list must be).

Conditions are data (spec/predicates.py) evaluated here; routers (`module:callable`) are
imported only with trust_code and called in a worker thread, once per router and sender
output, whatever the number of edges they decide.
"""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

import anyio.to_thread

from ..errors import NodeFailed, UsageError, format_path, node_failed
from ..executors.trusted_code import import_callable
from ..plan.dag import Plan, PlanEdge, PlanNode
from ..plan.runtime_foreach import read_items
from ..results.run_result import NodeResult
from ..spec import predicates

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]


class Routing:
    """Decides one run's conditional edges from its results; every decision is made once,
    published as an `edge` event, and kept in `fired`."""

    def __init__(self, plan: Plan, results: dict[str, NodeResult], skipped: dict[str, str], publish: Publish) -> None:
        self.plan, self.results, self.skipped, self.publish = plan, results, skipped, publish
        self.fired: dict[int, bool] = {}  # conditional edge id -> decision
        self.stopped: dict[str, str | None] = {}  # check node -> why its loop stopped there (None: it went on)
        self._routed: dict[tuple[str, str], Any] = {}  # (router, source node) -> what it answered
        self._lists: dict[tuple[str, int], list[str] | None] = {}  # (producer, max_items) -> its list; None: skipped

    async def decide(self, name: str) -> tuple[list[PlanEdge], str | None]:
        """(the inbound edges of `name` that fired, in arrival order; the reason it is skipped,
        or None when it runs). Everything its edges wait for must be settled."""
        node = self.plan.node(name)
        if node.foreach_from is not None:
            items = await self.items(node)
            if items is None:
                return [], f"{node.foreach_from} was skipped, so there is no list to range over"
            if node.index is not None and node.index >= len(items):
                return [], f"{node.foreach_from}'s list has {len(items)} item{'' if len(items) == 1 else 's'}"
        incoming = self.plan.incoming(name)
        fired = [edge for edge in incoming if await self.fires(edge)]
        if not incoming or fired:
            return fired, None
        return [], await self._reason(incoming)

    async def items(self, node: PlanNode) -> list[str] | None:
        """The list run-time foreach copy `node` ranges over (its producer must be settled);
        None when the producer was skipped; NodeFailed naming the copy for a bad list."""
        producer = str(node.foreach_from)
        spec = self.plan.spec_node(node)
        key = (producer, spec.foreach.max_items)  # type: ignore[union-attr]
        if key not in self._lists:
            if producer not in self.results:
                self._lists[key] = None
            else:  # reading JSON out of a long text: off the event loop, as conditions do
                text = self.results[producer].effective_text
                with node_failed(node.name):
                    self._lists[key] = await anyio.to_thread.run_sync(
                        read_items, text, producer, node.declared, key[1], abandon_on_cancel=True)
        return self._lists[key]

    async def fires(self, edge: PlanEdge) -> bool:
        """Whether `edge` fired (its source and loop check must be settled)."""
        if not edge.conditional:
            return edge.source in self.results
        if edge.id in self.fired:
            return self.fired[edge.id]
        decision = edge.source in self.results
        if decision and edge.stop is not None:
            stopped = await self._stopped(edge)
            decision = stopped if edge.stop.exits else not stopped
        if decision and edge.when is not None:
            decision = await self._holds(edge, edge.when, edge.source, until=False)
        self.fired[edge.id] = decision
        await self.publish("edge", {"edge": edge.id, "source": edge.source, "target": edge.target, "fired": decision})
        return decision

    async def _stopped(self, edge: PlanEdge) -> bool:
        """Whether the loop stopped after `edge.stop.round`: its until held on the check node,
        or the check node was skipped (no verdict to go on with)."""
        stop = edge.stop
        assert stop is not None
        if stop.check not in self.stopped:
            if stop.check not in self.results:
                self.stopped[stop.check] = f"{stop.check} was skipped"
            elif await self._holds(edge, stop.until, stop.check, until=True):
                self.stopped[stop.check] = "until held"
            else:
                self.stopped[stop.check] = None
        return self.stopped[stop.check] is not None

    async def _holds(self, edge: PlanEdge, condition: Any, reader: str, *, until: bool) -> bool:
        text = self.results[reader].effective_text
        references = list(predicates.routers(condition))
        if not references:
            if predicates.needs_worker(condition):  # a regex or JSON over a long text: never on the loop
                return await anyio.to_thread.run_sync(predicates.holds, condition, text, abandon_on_cancel=True)
            return predicates.holds(condition, text)
        target = edge.routes_to or self.plan.node(edge.target).declared  # the name its edge writes
        answers = {reference: await self._route(edge, reference, reader, text) for reference in references}

        def routed(reference: str) -> bool:
            answer = answers[reference]
            if until:
                if not isinstance(answer, bool):
                    raise UsageError(f"until router {reference!r} returned {type(answer).__name__} {answer!r}; "
                                     "an until router returns True (stop) or False (go on)")
                return answer
            return predicates.router_fires(answer, target, reference)

        try:
            return predicates.holds(condition, text, routed)
        except ValueError as error:
            raise NodeFailed(edge.target, error, edge) from error

    async def _route(self, edge: PlanEdge, reference: str, reader: str, text: str) -> Any:
        key = (reference, reader)
        if key not in self._routed:
            field_name = f"{format_path(edge.spec_path) or f'edges[{edge.declared}]'} router"
            with node_failed(edge.target, edge):  # user code may raise anything: the edge's receiver fails
                router = import_callable(reference, trust_code=self.plan.trust_code, field_name=field_name)
                self._routed[key] = await anyio.to_thread.run_sync(functools.partial(router, text))
        return self._routed[key]

    async def _reason(self, incoming: tuple[PlanEdge, ...]) -> str:
        """Why a node none of whose edges fired is skipped, in a few words."""
        if self.plan.node(incoming[0].target).round is not None:
            for edge in incoming:  # a later round of a stopped loop says where it stopped
                inherited = self.skipped.get(edge.source, "")
                if inherited.startswith("loop stopped after round"):
                    return inherited
        for edge in incoming:
            stop = edge.stop
            if stop is not None and not stop.exits and await self._stopped(edge):
                return f"loop stopped after round {stop.round} ({self.stopped[stop.check]})"
        parts = []
        for edge in incoming:
            if edge.source in self.skipped:
                parts.append(f"{edge.source} skipped")
            elif edge.stop is not None and edge.stop.exits and not self.stopped.get(edge.stop.check):
                parts.append(f"{edge.source} -> {edge.target}: the loop went on after round {edge.stop.round}")
            else:
                parts.append(f"{edge.source} -> {edge.target}: condition not met")
        return "no inbound edge fired (" + "; ".join(dict.fromkeys(parts)) + ")"
