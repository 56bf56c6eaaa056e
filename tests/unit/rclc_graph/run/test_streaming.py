"""`astream` and `stream` (issue 15, item 1): typed events with the bounded stream's
backpressure, early exit that stops the run, and a sync twin that works in plain code and
inside a running loop."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from rclc_graph import GraphError, astream, stream
from rclc_graph.plan.builder import Graph
from rclc_graph.results import run_events as ev
from rclc_graph.testing import FakeExecutor


def graph():
    return (Graph("pair").input("question").model("base").agent("a", model="base").agent("b", model="base")
            .node("first", agent="a", prompt="{question}", generate=False)
            .node("second", agent="b", prompt="Answer:", output=True)
            .edge("first", "second", policy={"mode": "state", "ratio": 2}))


INPUTS = {"question": "Who?"}


def test_astream_yields_typed_events_and_keeps_the_result():
    async def main():
        seen = []
        async with astream(graph(), INPUTS, executor=FakeExecutor()) as events:
            async for event in events:
                seen.append(event)
        return seen, events

    seen, events = anyio.run(main)
    assert all(isinstance(event, ev.RunEvent) for event in seen)
    assert [event.type for event in seen][:2] == ["run.started", "node.started"]
    assert seen[-1].type == "run.finished" and events.result.outputs == {"second": "answer of second"}
    assert events.stats().delivered == len(seen)


def test_a_slow_consumer_holds_the_run_back_within_the_bound():
    async def main():
        count = 0
        async for _ in (events := astream(graph(), INPUTS, executor=FakeExecutor(), max_events=1)):
            count += 1
            await anyio.sleep(0.01)
        return count, events.stats()

    count, stats = anyio.run(main)
    assert stats.high_water_events == 1 and stats.blocked_publishes >= 1 and stats.delivered == count


def test_leaving_the_block_early_cancels_the_run_and_records_what_finished(tmp_path):
    executor = FakeExecutor(hang="second")

    async def main():
        async with astream(graph(), INPUTS, executor=executor, out=tmp_path) as events:
            async for event in events:
                if event.type == "hop.delivered":
                    break
        return events

    events = anyio.run(main)
    assert executor.running == 0 and events.result is None
    run_dir = next(tmp_path.iterdir())
    from rclc_graph import read_record
    record = read_record(run_dir)
    assert record["status"] == "cancelled" and list(record["nodes"]) == ["first"]


def test_a_cancelled_consumer_stops_the_run_without_waiting_for_room():
    executor = FakeExecutor(hang="second")

    async def main():
        with anyio.CancelScope() as scope:
            async with astream(graph(), INPUTS, executor=executor, max_events=1) as events:
                async for _ in events:
                    # never takes the next event: the run waits for room; cancelled once it does
                    # (not after a delay, which a slow machine could outlast before it blocks)
                    with anyio.fail_after(60):  # a run that never blocks fails, not hangs
                        while events.stats().blocked_publishes < 1:
                            await anyio.sleep(0.005)
                    scope.cancel()
                    await anyio.sleep(10)
        return scope, events

    scope, events = anyio.run(main)
    assert scope.cancelled_caught and executor.running == 0
    assert events.stats().blocked_publishes >= 1 and events.result is None


def test_errors_of_planning_raise_at_the_call_and_a_plan_refuses_inputs():
    with pytest.raises(GraphError):
        astream(graph(), {})
    with pytest.raises(ValueError, match="inputs: a Plan is already compiled"):
        astream(graph().plan(INPUTS), INPUTS)


def test_stream_is_the_sync_twin_also_inside_a_running_loop(tmp_path):
    with stream(graph(), INPUTS, executor=FakeExecutor(), out=tmp_path) as events:
        types = [event.type for event in events]
    assert types[0] == "run.started" and types[-1] == "run.finished"
    assert events.record["status"] == "finished" and events.run_dir.parent == tmp_path

    async def cell():  # a notebook cell: sync code inside asyncio's running loop
        return [event.type for event in stream(graph(), INPUTS, executor=FakeExecutor())]
    assert asyncio.run(cell()) == [t for t in types]


def test_closing_the_sync_stream_early_stops_the_run_and_its_thread():
    executor = FakeExecutor(hang="second")
    events = stream(graph(), INPUTS, executor=executor)
    for event in events:
        if event.type == "hop.delivered":
            break
    run_thread = events._thread  # private on purpose: the promise under test is that close() joins it
    events.close()  # returns once the run's thread has ended (a hang fails on CI's timeout)
    assert executor.running == 0  # the hung node (it sleeps forever) ended: only a cancellation ends it
    # The run's own thread, not the process's thread count: anyio's idle worker threads of the
    # finished loop exit on their own schedule, so a count would depend on load.
    assert run_thread is not None and not run_thread.is_alive()


def test_an_error_during_the_run_reaches_the_consumer_after_the_events(monkeypatch):
    async def main():
        seen = []
        async for event in astream(graph(), INPUTS, executor="no-such-executor"):
            seen.append(event)
        return seen

    with pytest.raises(ValueError, match="executor"):
        anyio.run(main)
    with pytest.raises(ValueError, match="executor"):
        list(stream(graph(), INPUTS, executor="no-such-executor"))


def test_cancel_stops_the_run_and_the_stream_still_delivers_its_cancelled_notice():
    async def main():
        types = []
        events = astream(graph(), INPUTS, executor=FakeExecutor(hang="second"))
        async with events:
            async for event in events:
                types.append(event.type)
                if event.type == "hop.delivered":
                    events.cancel()
        return types, events

    types, events = anyio.run(main)
    assert types[-1] == "run.cancelled" and events.cancelled and events.result is None
