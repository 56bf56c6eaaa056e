"""User selectors and reasoning methods take turns across concurrent transfers; built-ins and
callables declared `rclc.thread_safe` run at once (issue 24 item 12).

No test here measures time. A serialized callable is shown by a first call that waits for a
second one which cannot enter while it runs (the wait ends by its short timeout, and the
peak stays 1 whatever the machine's speed); a concurrent one by a barrier both calls must
reach together (with a timeout far beyond any machine's delay)."""

from __future__ import annotations

import functools
import threading

import anyio
import pytest

import rclc
from rclc import HFReceiver, transfer

from tests.helpers.selector_inputs import make_sender

SECOND_CALL_WAIT = 1.0  # how long a serialized call waits for a second one that cannot come
TOGETHER_WAIT = 60.0  # how long concurrent calls may take to meet (never reached unless broken)


class Entries:
    """Counts callers inside a callable at once, and the peak."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.peak = 0
        self.second = threading.Event()

    def enter(self) -> None:
        with self.lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            if self.inside >= 2:
                self.second.set()

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


def waiting_selector(entries: Entries):
    def selector(sender, request_ids, budget):
        entries.enter()
        try:
            entries.second.wait(SECOND_CALL_WAIT)  # a concurrent second call would end this at once
        finally:
            entries.leave()
        return list(range(budget))

    return selector


def meeting_selector(entries: Entries):
    barrier = threading.Barrier(2, timeout=TOGETHER_WAIT)

    def selector(sender, request_ids, budget):
        entries.enter()
        try:
            barrier.wait()  # breaks (BrokenBarrierError) if the two calls cannot run together
        finally:
            entries.leave()
        return list(range(budget))

    return selector


def _two_transfers(model, tokenizer, selector, **options) -> None:
    senders = [make_sender(model, tokenizer) for _ in range(2)]
    receivers = [HFReceiver(model, tokenizer, max_new_tokens=1) for _ in range(2)]

    async def both() -> None:
        async with anyio.create_task_group() as group:
            for sender, receiver in zip(senders, receivers):
                group.start_soon(functools.partial(transfer, sender, receiver, "Who owns Cedar?", budget=4,
                                                   selector=selector, **options))

    anyio.run(both)
    assert all(len(receiver) == 1 for receiver in receivers)


# issue 24 item 12: two concurrent transfers ran a user's selector in two threads at once
def test_a_user_selector_runs_one_call_at_a_time(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    entries = Entries()
    _two_transfers(model, tokenizer, waiting_selector(entries))
    assert entries.peak == 1


# issue 24 item 12
@pytest.mark.parametrize("declare", ["decorator", "partial"])
def test_a_selector_declared_thread_safe_runs_concurrently(tiny_qwen3, declare):
    model, tokenizer = tiny_qwen3
    entries = Entries()
    selector = meeting_selector(entries)
    declared = rclc.thread_safe(selector) if declare == "decorator" else rclc.thread_safe(functools.partial(selector))
    assert rclc.is_thread_safe(declared) and rclc.is_thread_safe(functools.partial(declared))
    _two_transfers(model, tokenizer, declared)
    assert entries.peak == 2


# issue 24 item 12: built-ins keep running concurrently
def test_built_in_selectors_and_baselines_are_exempt():
    from rclc.selectors import recent, random_selector
    # private on purpose: the thread-safety exemption table under test
    from rclc.user_code import _exempt

    assert rclc.is_thread_safe(recent) and rclc.is_thread_safe(random_selector(3))
    assert _exempt(rclc.selectors.cacheback, builtin=True)
    assert not _exempt(lambda *args: [0], builtin=False)
    with pytest.raises(ValueError, match="thread_safe: expected a callable"):
        rclc.thread_safe(3)


def _reasoning_transfers(model, tokenizer, method) -> None:
    _two_transfers(model, tokenizer, None, reasoning=method, reasoning_context="full", reasoning_budget=2)


# issue 24 item 12: a user's synchronous reasoning method takes turns too
def test_a_user_reasoning_method_runs_one_call_at_a_time(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    entries = Entries()

    def method(state, *, max_positions, request):
        entries.enter()
        try:
            entries.second.wait(SECOND_CALL_WAIT)
        finally:
            entries.leave()
        return state

    _reasoning_transfers(model, tokenizer, method)
    assert entries.peak == 1


# issue 24 item 12: an async reasoning method runs on the caller's loop and may await other
# work without holding a turn (the seed's words), so two of them interleave
def test_async_reasoning_methods_hold_no_turn(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    entries = Entries()

    async def method(state, *, max_positions, request):
        entries.enter()
        try:
            with anyio.fail_after(TOGETHER_WAIT):
                while not entries.second.is_set():
                    await anyio.sleep(0.01)
        finally:
            entries.leave()
        return state

    _reasoning_transfers(model, tokenizer, method)
    assert entries.peak == 2


# issue 24 item 12: user code holding the turn may run a transfer with another user selector
# (the turn is its own: not waited for twice)
def test_a_serialized_method_may_run_another_user_callable_inside(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    inner_calls = []

    def inner(sender, request_ids, budget):
        inner_calls.append(budget)
        return list(range(budget))

    def method(state, *, max_positions, request):
        receiver = HFReceiver(model, tokenizer, max_new_tokens=1)
        rclc.transfer_sync(state, receiver, "Who?", budget=3, selector=inner)
        return state

    sender = make_sender(model, tokenizer)
    receiver = HFReceiver(model, tokenizer, max_new_tokens=1)
    rclc.transfer_sync(sender, receiver, "Who owns Cedar?", budget=5, reasoning=method,
                       reasoning_context="full", reasoning_budget=1)
    assert inner_calls == [3] and len(receiver) == 1


# issue 24 item 12: the graph's own selector of full edges is ours and stateless: it takes no turn
def test_the_graphs_full_edge_selector_runs_concurrently():
    from rclc_graph.executors.transfer_options import keep_everything

    assert rclc.is_thread_safe(keep_everything)
