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
from rclc.models import CAPTURE_ATTENTION


def _slow_selector(started: threading.Event, finished: threading.Event, seconds: float):
    def slow(sender, request_ids, budget):
        started.set()
        time.sleep(seconds)
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
            transfer(sender, got.append, "Who owns Cedar?", selector=_slow_selector(started, finished, 1.0)))
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
        task = asyncio.ensure_future(transfer(sender, got.append, "Who owns Birch?", selector=_slow_selector(started, finished, 1.0)))
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
    sender = sender_from_hf(model, tokenizer, "the cat sat on the mat. " * 110)
    assert 1400 < sender.input_embeds.shape[0] < 1500
    request = "why " * 125  # ~500 tokens
    seen: list[str] = []

    async def main() -> None:
        task = asyncio.ensure_future(transfer(sender, lambda delivery: None, request))
        deadline = time.monotonic() + 30
        while model.config._attn_implementation != CAPTURE_ATTENTION and not task.done():
            assert time.monotonic() < deadline
            await asyncio.sleep(0)
        seen.append(model.config._attn_implementation)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen.append(model.config._attn_implementation)

    asyncio.run(main())
    assert seen[0] == CAPTURE_ATTENTION, "the capture was over before the test could cancel it"
    assert seen[1] == original
