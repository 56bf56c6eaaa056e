"""The bounded event stream: bounds, backpressure, ordering, epochs, accounting."""

from __future__ import annotations

import json
from functools import partial

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rclc_graph.results.events import EVENT_OVERHEAD_BYTES, EventStream, estimate_bytes


def run(main):
    return anyio.run(main, backend="asyncio")


def test_count_bound_blocks_and_resumes():
    async def main():
        stream = EventStream(max_events=2, max_bytes=10_000)
        epoch = stream.open_epoch()
        await stream.publish("run", {"state": "start"}, run_id="r", epoch=epoch)
        await stream.publish("node", {"node": "a"}, run_id="r", epoch=epoch)
        with pytest.raises(anyio.WouldBlock):
            stream.try_publish("node", {"node": "b"}, run_id="r", epoch=epoch)
        with anyio.move_on_after(0.05) as scope:
            await stream.publish("node", {"node": "b"}, run_id="r", epoch=epoch)
        assert scope.cancelled_caught  # it waited for room
        async with anyio.create_task_group() as group:
            group.start_soon(partial(stream.publish, "node", {"node": "c"}, run_id="r", epoch=epoch))
            await anyio.sleep(0.01)
            assert stream.stats().queued == 2  # still blocked
            first = await stream.receive()
        assert first.payload == {"state": "start"}
        second, third = await stream.receive(), await stream.receive()
        assert [second.payload["node"], third.payload["node"]] == ["a", "c"]
        stats = stream.stats()
        assert stats.high_water_events == 2 and stats.blocked_publishes == 2 and stats.delivered == 3

    run(main)


def test_byte_bound_blocks():
    async def main():
        stream = EventStream(max_events=100, max_bytes=400)
        epoch = stream.open_epoch()
        event = await stream.publish("token", {"text": "x" * 200}, run_id="r", epoch=epoch)
        assert event.nbytes == EVENT_OVERHEAD_BYTES + 1 + estimate_bytes({"text": "x" * 200})
        with pytest.raises(anyio.WouldBlock):
            stream.try_publish("token", {"text": "y" * 200}, run_id="r", epoch=epoch)
        assert stream.try_publish("token", {"t": "z"}, run_id="r", epoch=epoch) is not None
        assert stream.stats().queued_bytes <= 400

    run(main)


# issue 24 item 4: an event larger than max_bytes was refused, failing its run (and every resume
# of it: a 1.9 MB answer bricked the run); it now waits for an empty queue and passes alone
def test_an_oversized_event_waits_for_an_empty_queue_and_passes_alone():
    async def main():
        stream = EventStream(max_events=100, max_bytes=400)
        epoch = stream.open_epoch()
        await stream.publish("token", {"text": "x"}, run_id="r", epoch=epoch)
        with pytest.raises(anyio.WouldBlock):  # not beside another event
            stream.try_publish("hop", {"blob": "b" * 1000}, run_id="r", epoch=epoch)
        received = []
        async with anyio.create_task_group() as group:
            async def consume():
                async for event in stream:
                    received.append(event.payload)
                    if len(received) == 3:
                        return

            group.start_soon(consume)
            await stream.publish("hop", {"blob": "b" * 1000}, run_id="r", epoch=epoch)
            await stream.publish("token", {"text": "after"}, run_id="r", epoch=epoch)
        assert [sorted(item) for item in received] == [["text"], ["blob"], ["text"]]
        oversized = EVENT_OVERHEAD_BYTES + 1 + estimate_bytes({"blob": "b" * 1000})
        assert stream.stats().high_water_bytes == oversized  # it was queued alone, nothing beside it

    run(main)


def test_waiters_are_served_in_arrival_order():
    async def main():
        stream = EventStream(max_events=10, max_bytes=300)
        epoch = stream.open_epoch()
        await stream.publish("token", {"text": "a" * 150}, run_id="r", epoch=epoch)
        order = []

        async def send(label, size):
            event = await stream.publish("token", {"text": label * size}, run_id="r", epoch=epoch)
            order.append((label, event.seq))

        async with anyio.create_task_group() as group:
            group.start_soon(send, "B", 150)  # does not fit yet
            await anyio.sleep(0.01)
            group.start_soon(send, "c", 1)  # would fit, but must not overtake B
            await anyio.sleep(0.01)
            assert order == []
            await stream.receive()  # room for B; c still waits behind it (B + c exceed the bytes)
            await anyio.sleep(0.01)
            assert order == [("B", 2)]
            await stream.receive()
        assert order == [("B", 2), ("c", 3)]

    run(main)


def test_retire_drops_queued_blocked_and_later_events():
    async def main():
        stream = EventStream(max_events=2, max_bytes=10_000)
        old, new = stream.open_epoch(), stream.open_epoch()
        await stream.publish("node", {"n": 1}, run_id="r", epoch=old)
        await stream.publish("node", {"n": 2}, run_id="s", epoch=new)
        results = []

        async def blocked():
            results.append(await stream.publish("node", {"n": 3}, run_id="r", epoch=old))

        async with anyio.create_task_group() as group:
            group.start_soon(blocked)
            await anyio.sleep(0.01)
            assert stream.retire(old) == 2  # one queued, one blocked
        assert results == [None]
        assert await stream.publish("token", {"t": "late"}, run_id="r", epoch=old) is None
        notice = await stream.cancel(old, run_id="r", payload={"reason": "user"})
        assert notice.kind == "cancelled" and notice.epoch == old
        stream.close()
        delivered = [event async for event in stream]
        assert [(event.epoch, event.kind) for event in delivered] == [(new, "node"), (old, "cancelled")]
        stats = stream.stats()
        assert stats.dropped_stale == 3 and stats.retired_epochs == (old,)
        assert stream.retire(old) == 0  # idempotent; the notice was already delivered

    run(main)


def test_close_ends_iteration_and_refuses_publishers():
    async def main():
        stream = EventStream(max_events=1, max_bytes=10_000)
        epoch = stream.open_epoch()
        await stream.publish("run", {}, run_id="r", epoch=epoch)
        failures = []

        async def blocked():
            try:
                await stream.publish("run", {}, run_id="r", epoch=epoch)
            except anyio.ClosedResourceError:
                failures.append("closed")

        async with anyio.create_task_group() as group:
            group.start_soon(blocked)
            await anyio.sleep(0.01)
            stream.close()
        assert failures == ["closed"]
        with pytest.raises(anyio.ClosedResourceError):
            await stream.publish("run", {}, run_id="r", epoch=epoch)
        assert [event.seq async for event in stream] == [1]
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()

    run(main)


def test_cancelled_publisher_leaves_the_queue():
    async def main():
        stream = EventStream(max_events=1, max_bytes=10_000)
        epoch = stream.open_epoch()
        await stream.publish("run", {}, run_id="r", epoch=epoch)
        with anyio.move_on_after(0.01):
            await stream.publish("run", {"lost": True}, run_id="r", epoch=epoch)
        await stream.receive()
        assert stream.try_publish("run", {"next": True}, run_id="r", epoch=epoch).seq == 2
        assert (await stream.receive()).payload == {"next": True}

    run(main)


def test_bad_arguments():
    async def main():
        stream = EventStream()
        with pytest.raises(ValueError, match="kind"):
            await stream.publish("progress", {}, run_id="r", epoch=1)
        with pytest.raises(ValueError, match="epoch"):
            await stream.publish("run", {}, run_id="r", epoch="1")
        with pytest.raises(ValueError, match="run_id"):
            await stream.publish("run", {}, run_id=3, epoch=1)

    run(main)
    with pytest.raises(ValueError, match="max_events"):
        EventStream(max_events=0)
    with pytest.raises(ValueError, match="max_bytes"):
        EventStream(max_bytes=10)


def test_events_are_frozen_and_serialisable():
    async def main():
        stream = EventStream()
        payload = {"node": "a", "tokens": [1, 2]}
        event = await stream.publish("node", payload, run_id="r", epoch=stream.open_epoch())
        payload["node"] = "changed"
        assert event.payload["node"] == "a"
        with pytest.raises(TypeError):
            event.payload["node"] = "b"
        json.dumps(event.to_dict())
        json.dumps(stream.stats().to_dict())

    run(main)


def test_estimate_grows_with_content():
    assert estimate_bytes("a" * 100) > estimate_bytes("a")
    assert estimate_bytes({"k": ["x" * 50, "y" * 50]}) > 100
    assert estimate_bytes(None) == estimate_bytes(3) == 8


# -- property test: many producers, a slow consumer, retirements and cancellations ----------------

producer_script = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 120), st.integers(0, 2)),  # (epoch slot, text size, pause)
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_events=st.integers(1, 5),
    max_bytes=st.integers(260, 900),
    producers=st.lists(producer_script, min_size=1, max_size=4),
    consumer_pauses=st.lists(st.integers(0, 3), max_size=40),
    retire_after=st.dictionaries(st.integers(0, 30), st.integers(0, 2), max_size=2),
    cancel_slot=st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 20))),
)
def test_stream_invariants(max_events, max_bytes, producers, consumer_pauses, retire_after, cancel_slot):
    async def main():
        stream = EventStream(max_events=max_events, max_bytes=max_bytes)
        epochs = [stream.open_epoch() for _ in range(3)]
        retired_now: set[int] = set()
        attempts = {epoch: 0 for epoch in epochs}
        returned = []  # events publish() handed back
        refused = 0  # publish() returned None
        delivered = []
        notices = []

        def check_bounds():
            stats = stream.stats()
            assert stats.queued <= max_events and stats.queued_bytes <= max_bytes

        async def producer(script, number):
            nonlocal refused
            for slot, size, pause in script:
                epoch = epochs[slot]
                attempts[epoch] += 1
                event = await stream.publish("token", {"text": "x" * size, "p": number}, run_id=f"run{slot}", epoch=epoch)
                if event is None:
                    refused += 1
                else:
                    returned.append(event)
                check_bounds()
                for _ in range(pause):
                    await anyio.lowlevel.checkpoint()

        async def canceller():
            slot, delay = cancel_slot
            for _ in range(delay):
                await anyio.lowlevel.checkpoint()
            retired_now.add(epochs[slot])
            notices.append(await stream.cancel(epochs[slot], run_id=f"run{slot}", payload={"why": "test"}))

        async def consumer():
            count = 0
            async for event in stream:
                check_bounds()
                if event.kind == "cancelled":
                    assert event in notices or event.epoch in retired_now
                else:
                    assert event.epoch not in retired_now, "an event of a retired epoch was delivered late"
                delivered.append(event)
                if count in retire_after:
                    epoch = epochs[retire_after[count]]
                    retired_now.add(epoch)
                    stream.retire(epoch)
                for _ in range(consumer_pauses[count % len(consumer_pauses)] if consumer_pauses else 0):
                    await anyio.lowlevel.checkpoint()
                count += 1

        async with anyio.create_task_group() as outer:
            outer.start_soon(consumer)
            async with anyio.create_task_group() as inner:
                for number, script in enumerate(producers):
                    inner.start_soon(producer, script, number)
                if cancel_slot is not None:
                    inner.start_soon(canceller)
            stream.close()

        stats = stream.stats()
        seqs = [event.seq for event in delivered]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "seq must increase strictly in delivery order"
        assert stats.high_water_events <= max_events and stats.high_water_bytes <= max_bytes
        plain = [event for event in delivered if event.kind != "cancelled"]
        assert [event for event in delivered if event.kind == "cancelled"] == notices
        # Every publish is either delivered or counted as stale, exactly once.
        assert sum(attempts.values()) == len(plain) + stats.dropped_stale
        assert stats.dropped_stale == refused + len(returned) - len(plain)
        delivered_seqs = {event.seq for event in plain}
        for event in returned:
            if event.seq not in delivered_seqs:
                assert event.epoch in retired_now
        for epoch in epochs:
            if epoch not in retired_now:
                assert attempts[epoch] == sum(1 for event in plain if event.epoch == epoch)
        assert stats.delivered == len(delivered) and stats.queued == 0

    run(main)
