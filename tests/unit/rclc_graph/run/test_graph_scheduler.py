"""The run loop with fake in-process nodes: order, fan-in determinism, overlap, failure, cancel."""

from __future__ import annotations

import functools

import anyio
import anyio.lowlevel
import pytest

from rclc_graph import EventStream, Graph, Lineage, Policy, testing
from rclc_graph.results.run_result import NodeResult
from rclc_graph.errors import NodeFailed
from rclc_graph.run.scheduler import run_plan, run_plan_sync


def joined_texts(reading):
    """Each node answers with its name and its senders' answers ("n3+n2+n1+n0"); a sender that
    only read (no text) is named instead."""
    said = [result.text if result.text is not None else result.node for _, result in reading.inbound]
    return "+".join([reading.node.name] + said)


def FakeExecutor(delay=None, fail=None):  # noqa: N802 - reads like the class it builds
    """Records when each node starts and ends; nodes sleep `delay[name]` seconds."""
    return testing.FakeExecutor(text=joined_texts, delays=delay, fail=fail or ())


def fan_graph(width=3):
    graph = Graph("fan").input("question").input("documents", "list[str]")
    graph.model("base").agent("reader", model="base")
    graph.node("worker", agent="reader", prompt="{item}", foreach="documents", generate=False)
    graph.node("final", agent="reader", prompt="{question}", output=True)
    graph.edge("worker", "final", Policy(ratio=4))
    return graph.plan({"question": "q", "documents": [f"d{i}" for i in range(width)]})


def chain_graph(length=4):
    graph = Graph("chain").input("question")
    graph.model("base").agent("reader", model="base")
    for i in range(length):
        graph.node(f"n{i}", agent="reader", prompt="{question}", output=i == length - 1)
        if i:
            graph.edge(f"n{i - 1}", f"n{i}", Policy(mode="text"))
    return graph.plan({"question": "q"})


def test_chain_runs_in_order_and_outputs_text():
    executor = FakeExecutor()
    result = run_plan_sync(chain_graph(), executor=executor)
    assert result.status == "finished"
    starts = [name for kind, name, _ in executor.log if kind == "start"]
    assert starts == ["n0", "n1", "n2", "n3"]
    assert result.outputs == {"n3": "n3+n2+n1+n0"}


def test_fan_in_is_deterministic_and_branches_overlap():
    # Later workers finish first; the receiver still gets its senders in edge order.
    executor = FakeExecutor(delay={"worker[0]": 0.06, "worker[1]": 0.03, "worker[2]": 0.0})
    result = run_plan_sync(fan_graph(), executor=executor)
    assert executor.peak == 3  # independent branches overlap
    final_start = [entry for entry in executor.log if entry[:2] == ("start", "final")][0]
    assert final_start[2] == ["worker[0]", "worker[1]", "worker[2]"]
    assert result.outputs["final"] == "final+worker[0]+worker[1]+worker[2]"
    ends = [name for kind, name, _ in executor.log if kind == "end"]
    assert ends.index("final") == 3  # it ran after all its senders


def test_failure_names_node_and_cancels_other_branches():
    executor = FakeExecutor(delay={"worker[0]": 0.5, "worker[2]": 0.5}, fail={"worker[1]"})
    result = run_plan_sync(fan_graph(), executor=executor)
    assert result.status == "failed" and result.failed_node == "worker[1]"
    assert "worker[1]" in result.error and "broke" in result.error
    assert not any(name == "final" for _, name, _ in executor.log)
    assert executor.running == 0
    assert executor.released == [result.run_id]


def test_completed_nodes_are_not_run_again():
    executor = FakeExecutor()
    plan = chain_graph()
    done = {name: NodeResult(name, name.upper(), 1, 0, Lineage.fresh(name, 1), "", 0, []) for name in ("n0", "n1")}
    result = run_plan_sync(plan, executor=executor, completed=done)
    assert [name for kind, name, _ in executor.log if kind == "start"] == ["n2", "n3"]
    assert result.outputs == {"n3": "n3+n2+N1"}


def test_events_are_ordered_and_cancellation_retires_the_epoch():
    executor = FakeExecutor(delay={"n1": 10})
    plan = chain_graph()
    seen = []

    async def main():
        events = EventStream(max_events=4)
        async with anyio.create_task_group() as group:
            async def consume():
                async for event in events:
                    seen.append(event)
                    if event.kind == "cancelled":
                        return

            group.start_soon(consume)
            with anyio.move_on_after(0.3) as scope:
                await run_plan(plan, executor=executor, events=events)
            assert scope.cancelled_caught
        return events.stats()

    stats = anyio.run(main)
    kinds = [event.kind for event in seen]
    assert kinds[0] == "run" and kinds[-1] == "cancelled"
    assert [event.seq for event in seen] == sorted(event.seq for event in seen)
    assert stats.high_water_events <= 4
    assert executor.running == 0
    assert not any(entry[:2] == ("end", "n1") for entry in executor.log)


def test_unexpected_executor_errors_become_node_failures():
    broken = testing.FakeExecutor(fail=lambda node: KeyError("lost"))
    result = run_plan_sync(chain_graph(2), executor=broken)
    assert result.status == "failed" and result.failed_node == "n0" and "KeyError" in result.error


def test_node_failed_message_names_edge():
    plan = fan_graph()
    edge = plan.incoming("final")[0]
    error = NodeFailed("final", ValueError("budget too small"), edge)
    assert "final" in str(error) and "worker[0]" in str(error) and "r4" in str(error) and "budget too small" in str(error)


def test_many_runs_share_one_process():
    executor = FakeExecutor(delay={"worker[0]": 0.01})

    async def main():
        results = []
        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(functools.partial(_collect, results, fan_graph(), executor))
        return results

    results = anyio.run(main)
    assert len(results) == 8 and {r.status for r in results} == {"finished"}
    assert len({r.run_id for r in results}) == 8


async def _collect(results, plan, executor):
    results.append(await run_plan(plan, executor=executor))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_backends(backend):
    pytest.importorskip(backend)
    result = anyio.run(functools.partial(run_plan, chain_graph(2), executor=FakeExecutor()), backend=backend)
    assert result.status == "finished"


class _TaskCounting(testing.FakeExecutor):
    """Records, per node, the task it ran in and the context it was handed."""

    def __init__(self, **options):
        super().__init__(**options)
        self.tasks, self.contexts = {}, {}

    async def run_node(self, ctx, node, inbound):
        self.tasks[node.name] = anyio.get_current_task().id
        self.contexts[node.name] = ctx
        return await super().run_node(ctx, node, inbound)


def test_a_chain_runs_in_one_task_and_a_fan_out_gets_a_task_per_branch():
    # Issue 28: a node's task goes on with the node it made ready, so a chain pays no task
    # start-up per node; independent branches still overlap in tasks of their own.
    chain = _TaskCounting()
    assert run_plan_sync(chain_graph(6), executor=chain).status == "finished"
    assert len(set(chain.tasks.values())) == 1
    fan = _TaskCounting(delays={"worker[0]": 0.02, "worker[1]": 0.02, "worker[2]": 0.02})
    result = run_plan_sync(fan_graph(3), executor=fan)
    assert result.status == "finished" and fan.peak == 3
    assert len({fan.tasks[f"worker[{index}]"] for index in range(3)}) == 3


def test_a_run_nobody_watches_publishes_nothing_and_hands_nodes_the_runs_own_context(monkeypatch):
    # No event stream and no tracer provider: no node or hop event is built, and the executor
    # gets the run's context itself (no per-node publisher wrapping it). Another test of this
    # process (test_tracing.py) may have set the global provider: this one sees none.
    from rclc_graph.run import tracing

    if tracing.trace is not None:
        monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: tracing.trace.ProxyTracerProvider())
    executor = _TaskCounting()
    assert run_plan_sync(chain_graph(3), executor=executor).status == "finished"
    contexts = list(executor.contexts.values())
    assert all(ctx is contexts[0] for ctx in contexts)
    assert contexts[0].publish.quiet
    watched = _TaskCounting()
    events = []

    async def main():
        stream = EventStream(max_events=1000)
        result = await run_plan(chain_graph(3), executor=watched, events=stream)
        stream.close()
        async for event in stream:
            events.append(event)
        return result

    assert anyio.run(main).status == "finished"
    assert not any(ctx.publish is contexts[0].publish for ctx in watched.contexts.values())
    kinds = [(event.kind, event.payload.get("status")) for event in events]
    assert kinds.count(("node", "started")) == 3 and kinds.count(("node", "finished")) == 3


def test_a_long_chain_of_nodes_that_never_wait_still_lets_other_tasks_run():
    # The chain's task yields between nodes, so another task on the loop (another run, a
    # consumer) is not starved by a chain of nodes that never await anything.
    ticks = []

    class Instant(testing.FakeExecutor):
        async def run_node(self, ctx, node, inbound):  # returns without awaiting anything
            return NodeResult(node.name, None, 0, 0, Lineage(), "", 0, [])

    async def main():
        async with anyio.create_task_group() as group:
            async def tick():
                while True:
                    ticks.append(1)
                    await anyio.lowlevel.checkpoint()

            group.start_soon(tick)
            await anyio.lowlevel.checkpoint()
            before = len(ticks)
            result = await run_plan(chain_graph(50), executor=Instant())
            group.cancel_scope.cancel()
        return result, len(ticks) - before

    result, during = anyio.run(main)
    assert result.status == "finished" and during >= 49
