"""Graphs run end to end on tiny random models: lineage sums, budget laws over hops, cancellation."""

from __future__ import annotations

import math
import threading
import time

import anyio
import pytest

from rclc_graph import EventStream, Graph, LocalExecutor, ModelPool, Policy, RunContext
from rclc_graph.run.scheduler import run_plan, run_plan_sync
from rclc_graph.spec.models import ModelSpec

from tests.helpers.cancelling import ENGINE_THREADS, busy_threads
from tests.helpers.holding import wait_for_cancel

WORDS = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. " * 3


@pytest.fixture
def pool(tiny):
    model, tokenizer = tiny
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def chain(hops: int, policy, *, final_generates=True):
    graph = Graph("chain").input("question").input("chunks", "list[str]")
    graph.model("base").agent("reader", model="base", max_new_tokens=3)
    for i in range(hops):
        graph.node(f"r{i}", agent="reader", prompt=f"Part {i}: {{chunks[{i}]}}", generate=False)
        if i:
            graph.edge(f"r{i - 1}", f"r{i}", policy)
    graph.node("final", agent="reader", prompt="{question}", output=True, generate=final_generates)
    graph.edge(f"r{hops - 1}", "final", policy)
    return graph.plan({"question": "Who owns Cedar?", "chunks": [WORDS] * hops})


def _check_lineage(result):
    for name, node in result.nodes.items():
        assert len(node.lineage) == node.positions, name
    for hop in result.hops:
        if hop.mode == "text":
            continue
        assert sum(hop.kept_by_origin.values()) == hop.kept_positions
        assert hop.kept_positions <= hop.budget


def test_relative_growth_over_five_hops(pool):
    # The seed's selection (the fine fixed grid, nothing excluded): every hop's rows can then
    # reach the final node. Whole sentences on a random tiny model may drop one node's rows
    # entirely, and identical chunks are text the receiver holds (passed over by default).
    result = run_plan_sync(chain(5, Policy(ratio=4, span="fixed", exclude=[])), pool=pool)
    assert result.status == "finished", result.error
    _check_lineage(result)
    for hop in result.hops:
        expected = hop.inherited_positions + math.ceil((hop.total_positions - hop.inherited_positions) / 4)
        assert hop.budget == expected == hop.kept_positions
    # Relative memory grows by the compressed new rows at each hop.
    kept = [hop.kept_positions for hop in result.hops]
    assert kept == sorted(kept) and kept[-1] > kept[0]
    final = result.nodes["final"]
    assert final.inherited_positions == result.hops[-1].kept_positions
    assert set(final.lineage.counts_by_node()) >= {"r0", "r1", "r2", "r3", "r4", "final"}
    hops_survived = final.lineage.counts_by_hops()
    assert max(hops_survived) == 5  # rows of r0 crossed five edges to reach final


def test_bounded_caps_stop_growth(pool):
    cap = 24
    result = run_plan_sync(chain(5, Policy(budget=cap)), pool=pool)
    assert result.status == "finished", result.error
    _check_lineage(result)
    for hop in result.hops:
        assert hop.budget == min(cap, hop.total_positions) and hop.kept_positions == hop.budget
    assert all(hop.kept_positions == cap for hop in result.hops)


def test_full_and_text_edges(pool):
    graph = Graph("mixed").input("question")
    graph.model("base").agent("reader", model="base", max_new_tokens=3)
    graph.node("a", agent="reader", prompt="{question} " + WORDS)
    graph.node("b", agent="reader", prompt="{question}")
    graph.node("c", agent="reader", prompt="{question}", output=True)
    graph.edge("a", "c", Policy(mode="full"))
    graph.edge("b", "c", Policy(mode="text"))
    result = run_plan_sync(graph.plan({"question": "Who owns Cedar?"}), pool=pool)
    assert result.status == "finished", result.error
    full = [hop for hop in result.hops if hop.mode == "full"][0]
    assert full.kept_positions == full.total_positions == result.nodes["a"].positions
    text = [hop for hop in result.hops if hop.mode == "text"][0]
    assert text.payload_bytes == len(result.nodes["b"].text.encode())
    assert f"Message from b:\n{result.nodes['b'].text.strip()}" in result.nodes["c"].prompt_text
    _check_lineage(result)


def test_fan_in_order_and_lineage(pool):
    graph = Graph("fan").input("question").input("documents", "list[str]")
    graph.model("base").agent("reader", model="base", max_new_tokens=3)
    graph.node("w", agent="reader", prompt="{item}", foreach="documents", generate=False)
    graph.node("final", agent="reader", prompt="{question}", output=True)
    graph.edge("w", "final", Policy(ratio=2, request="{question}"))
    plan = graph.plan({"question": "Who owns Cedar?", "documents": [WORDS, WORDS[:40], WORDS[:80]]})
    first = run_plan_sync(plan, pool=pool)
    again = run_plan_sync(plan, pool=pool)
    assert first.outputs == again.outputs  # greedy decoding reproduces the run
    final = first.nodes["final"]
    origins = [origin.node for origin in final.lineage][: final.inherited_positions]
    assert origins == sorted(origins)  # w[0]'s rows, then w[1]'s, then w[2]'s
    _check_lineage(first)


def test_a_bad_budget_fails_the_node_with_its_edge(pool):
    result = run_plan_sync(chain(2, Policy(budget=1, selector="cacheback", reasoning={"steps": 2})), pool=pool)
    assert result.status == "failed"
    assert "r1" in result.error and "'r0' -> 'r1'" in result.error


def test_cancellation_stops_generation_and_restores_dispatch(pool, tiny):
    model, _ = tiny
    graph = Graph("long").input("question")
    graph.model("base").agent("talker", model="base", max_new_tokens=2000)
    graph.node("a", agent="talker", prompt="{question}", output=True)
    plan = graph.plan({"question": "Say a lot."})
    steps = []
    cancelling = threading.Event()
    at_cancel = []

    def counted_step(*args):
        steps.append(time.monotonic())
        if cancelling.is_set():
            # A step that began after the cancellation waits until it has reached the engine
            # (the sequence is gone), so no clock races the cancellation: the engine may
            # finish this step, and must start no other. Bounded: a broken cancel fails below.
            wait_for_cancel(model)

    hook = model.get_input_embeddings().register_forward_hook(counted_step)

    async def main():
        events = EventStream(max_events=8)
        tokens = []
        scope = anyio.CancelScope()

        async def consume():
            async for event in events:
                if event.kind == "token":
                    tokens.append(event)
                    if len(tokens) == 3 and not cancelling.is_set():  # mid-generation: cancel the run
                        cancelling.set()
                        at_cancel.append(len(steps))
                        scope.cancel()
                if event.kind == "cancelled":
                    return

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            with scope:
                await run_plan(plan, pool=pool, events=events)
            if not scope.cancelled_caught:
                events.close()  # the run ended before its third token: nothing to wait for
        return tokens, events.stats(), scope

    try:
        tokens, stats, scope = anyio.run(main)
    finally:
        hook.remove()
    assert scope.cancelled_caught, "generation ended before its third token; the test did not cancel anything"
    assert len(steps) < 2000  # generation ended early
    assert len(steps) - at_cancel[0] <= 1  # at most one step began after the cancellation
    assert model.config._attn_implementation == "sdpa"
    assert stats.retired_epochs
    # nothing left computing: counting threads instead would count anyio's idle workers, which
    # exit on their own schedule (issue 24: a count failed under load)
    assert [entry for entry in busy_threads() if not entry.startswith(ENGINE_THREADS)] == []


def test_a_run_stopped_mid_generation_records_nothing_and_publishes_no_more_tokens(pool):
    # The run's stop flag alone (what a replica's `stop` sets, and what the scheduler sets when
    # a run is cancelled): generation ends, the node raises the run's cancellation, its agent
    # keeps the state it had before generating, and no token event follows the stop.
    graph = Graph("stopped").input("question")
    graph.model("base").agent("talker", model="base", max_new_tokens=40)
    graph.node("a", agent="talker", prompt="{question}", output=True)
    plan = graph.plan({"question": "Say a lot."})
    executor = LocalExecutor(pool)
    bound = []
    original_bind = executor.bind
    executor.bind = lambda ctx, node: bound.append(original_bind(ctx, node)) or bound[-1]
    events = []

    async def main():
        async def publish(kind, payload):
            events.append((kind, payload))
            if kind == "token" and payload["index"] == 1:
                ctx.stop.set()  # after the second token

        ctx = RunContext(run_id="stopped-run", plan=plan, publish=publish)
        with pytest.raises(anyio.get_cancelled_exc_class()):
            await executor.run_node(ctx, plan.node("a"), [])
        with pytest.raises(anyio.get_cancelled_exc_class()):  # stopped before it starts: no model work
            await executor.run_node(ctx, plan.node("a"), [])

    anyio.run(main)
    assert [payload["index"] for kind, payload in events if kind == "token"] == [0, 1]
    assert len(bound) == 2
    for agent in bound:
        report = agent.inspect()
        assert report["state_source"] == "messages" and report["cached_positions"] == 0
        assert not report["pending_generation"]
    with pytest.raises(KeyError):
        executor.agent("stopped-run", "a")


class _Holding(LocalExecutor):
    """Records how many agents the executor holds whenever a node starts."""

    def __init__(self, pool, **options):
        super().__init__(pool, **options)
        self.held = []

    async def run_node(self, ctx, node, inbound):
        self.held.append(len(self._agents))
        return await super().run_node(ctx, node, inbound)


def test_a_run_holds_only_the_states_its_unfinished_receivers_read(pool):
    # Issue 28: with keep_agents=False (what run_plan's own executor does) a chain holds one
    # sender's state while its receiver runs, whatever the chain's length; the outputs are
    # those of an executor that keeps every agent, and that one still hands them out after.
    plan = chain(6, Policy(budget=8))
    dropping = _Holding(pool, keep_agents=False)
    keeping = _Holding(pool)
    dropped = run_plan_sync(plan, executor=dropping)
    kept = run_plan_sync(plan, executor=keeping)
    assert dropped.status == kept.status == "finished"
    assert [node.lineage for node in dropped.nodes.values()] == [node.lineage for node in kept.nodes.values()]
    assert max(dropping.held) == 1 and not dropping._agents
    assert keeping.held == list(range(7)) and keeping.agent(kept.run_id, "r0") is not None
