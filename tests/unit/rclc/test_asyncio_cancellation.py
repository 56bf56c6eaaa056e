"""Cancelling model work with plain asyncio (`task.cancel()`, `asyncio.wait_for`) waits for the
worker to restore model state, as anyio cancellation does (api.md: "Cancellation during a
worker operation waits for it to restore model state, then raises CancelledError")."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import rclc
from rclc import sender_from_hf, transfer
# private on purpose: the decoder a forward hook holds, and the worker's stop flag (no public API)
from rclc._cache import backbone
from rclc._worker import stop_requested
from rclc.models import CAPTURE_ATTENTION


def _slow_selector(started: threading.Event, finished: threading.Event):
    """A selector that runs until its caller's cancellation reaches its worker (bounded at
    60 s), so the cancellation has to wait for it on any machine: a fixed sleep raced the
    test's timeout on a stalled one."""
    def slow(sender, request_ids, budget):
        started.set()
        deadline = time.monotonic() + 60
        while not stop_requested() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.2)  # still running after the stop: a cancellation that returned early shows
        finished.set()
        return list(range(budget))

    return slow


# issue 16 item 1: asyncio.wait_for timing out returned while a slow custom selector still ran
def test_wait_for_timeout_waits_for_the_selector(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, "The Cedar project is owned by Alice.")
    started, finished = threading.Event(), threading.Event()
    got: list = []

    async def main() -> None:
        # the timeout starts once the selector runs: a slow machine's setup must not outlast it
        task = asyncio.ensure_future(
            transfer(sender, got.append, "Who owns Cedar?", selector=_slow_selector(started, finished)))
        while not started.is_set():
            await asyncio.sleep(0.005)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(task, 0.05)
        assert finished.is_set(), "the cancellation returned while the selector still ran"

    asyncio.run(main())
    assert got == []


# issue 16 item 1: task.cancel() is plain asyncio cancellation too
def test_task_cancel_waits_for_the_selector_and_delivers_nothing(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, "The Birch project is owned by Bob.")
    started, finished = threading.Event(), threading.Event()
    got: list = []

    async def main() -> None:
        task = asyncio.ensure_future(transfer(sender, got.append, "Who owns Birch?", selector=_slow_selector(started, finished)))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        task.cancel()  # a second request changes nothing
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished.is_set(), "the cancellation returned while the selector still ran"

    asyncio.run(main())
    assert got == []
    again: list = []
    rclc.transfer_sync(sender, again.append, "Who owns Birch?", selector=lambda s, r, b: list(range(b)))
    assert len(again) == 1  # the state is reusable once cancellation completed


# issue 16 item 1: the capture attention mode was left on the model after wait_for timed out
def test_wait_for_during_attention_capture_restores_the_dispatch(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    original = model.config._attn_implementation
    sender = sender_from_hf(model, tokenizer, "The Cedar project is owned by Alice.")
    seen: list[str] = []
    capturing, released = threading.Event(), threading.Event()

    def hold_the_capture(module, args):
        # the capture's forward waits here until the test has cancelled, so the cancellation
        # lands during the capture on any machine (the test polled for a few-ms window before)
        if model.config._attn_implementation == CAPTURE_ATTENTION:
            capturing.set()
            released.wait(60)

    async def main() -> None:
        task = asyncio.ensure_future(transfer(sender, lambda delivery: None, "Who owns Cedar?"))
        assert await asyncio.to_thread(capturing.wait, 60), "no capture began"
        seen.append(model.config._attn_implementation)
        task.cancel()
        await asyncio.sleep(0)  # the cancellation is delivered to the task...
        released.set()  # ...before the capture may go on
        with pytest.raises(asyncio.CancelledError):
            await task
        seen.append(model.config._attn_implementation)

    handle = backbone(model).register_forward_pre_hook(hold_the_capture)
    try:
        asyncio.run(main())
    finally:
        released.set()
        handle.remove()
    assert seen[0] == CAPTURE_ATTENTION
    assert seen[1] == original
