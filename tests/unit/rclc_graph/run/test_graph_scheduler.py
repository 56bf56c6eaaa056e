"""The run loop with fake in-process nodes: order, fan-in determinism, overlap, failure, cancel."""

from __future__ import annotations

import functools

import anyio
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
