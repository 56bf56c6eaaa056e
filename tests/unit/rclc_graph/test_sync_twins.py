"""Every `*_sync` entry point works inside a running event loop (issue 15, item 1): a Jupyter
cell runs inside asyncio, and anyio.run there used to fail with "Already running asyncio in
this thread". The calls now run on a loop of their own in a worker thread (`rclc.call_sync`)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import anyio
import pytest
import trio

import rclc
from rclc import HFReceiver, sender_from_hf, transfer_sync
from rclc_graph import run_plan_sync, run_recorded_sync
from rclc_graph.plan.builder import Graph
from rclc_graph.testing import FakeExecutor

COLOUR = contextvars.ContextVar("colour", default="none")


async def _where(value: int) -> tuple[int, str, str]:
    await asyncio.sleep(0)
    return value * 2, threading.current_thread().name, COLOUR.get()


async def _boom() -> None:
    raise KeyError("inner")


def small_plan():
    graph = (Graph("pair").input("question").model("base").agent("a", model="base").agent("b", model="base")
             .node("first", agent="a", prompt="{question}", generate=False)
             .node("second", agent="b", prompt="Answer:", output=True)
             .edge("first", "second", policy={"mode": "state", "ratio": 2}))
    return graph.plan({"question": "Who?"})


def in_asyncio(function):
    """Call `function` from sync code running inside asyncio's loop, as a notebook cell does."""
    async def cell():
        return function()
    return asyncio.run(cell())


def test_call_sync_without_a_loop_runs_in_this_thread():
    assert rclc.call_sync(_where, 2)[:2] == (4, threading.current_thread().name)


def test_call_sync_inside_asyncio_runs_on_a_worker_loop_with_the_callers_context():
    def body():
        COLOUR.set("blue")
        return rclc.call_sync(_where, 3)

    value, thread, colour = in_asyncio(body)
    assert value == 6 and thread.startswith("rclc-sync-") and colour == "blue"


def test_call_sync_inside_a_loop_run_until_complete_and_inside_trio():
    loop = asyncio.new_event_loop()
    try:
        async def cell():
            return rclc.call_sync(_where, 5)[0]
        assert loop.run_until_complete(cell()) == 10
    finally:
        loop.close()

    async def trio_cell():
        return rclc.call_sync(_where, 7)[0]
    assert trio.run(trio_cell) == 14

    async def anyio_cell():  # anyio marks its loop in a context variable the worker must not inherit
        return rclc.call_sync(_where, 8)[0]
    assert anyio.run(anyio_cell) == 16
    assert anyio.run(anyio_cell, backend="trio") == 16


def test_call_sync_raises_the_callees_exception_unchanged():
    with pytest.raises(KeyError, match="inner"):
        in_asyncio(lambda: rclc.call_sync(_boom))
    with pytest.raises(KeyError, match="inner"):
        rclc.call_sync(_boom)


def test_run_plan_sync_and_run_recorded_sync_inside_a_running_loop(tmp_path):
    result = in_asyncio(lambda: run_plan_sync(small_plan(), executor=FakeExecutor()))
    assert result.status == "finished" and result.outputs == {"second": "answer of second"}
    result, record, run_dir = in_asyncio(lambda: run_recorded_sync(small_plan(), tmp_path, executor=FakeExecutor()))
    assert record["status"] == "finished" and (run_dir / "report.html").is_file()


@pytest.mark.parametrize("function", [run_plan_sync, run_recorded_sync])
def test_sync_twins_refuse_an_event_stream_and_name_the_streaming_calls(function):
    with pytest.raises(ValueError, match=r"events: .*rclc_graph.stream\(.*astream"):
        function(small_plan(), events=object())


def test_transfer_sync_inside_a_running_loop(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, "The Cedar project is owned by Alice Moreno.")
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    in_asyncio(lambda: transfer_sync(sender, receiver, "Who owns Cedar?", ratio=2))
    assert len(receiver) == 1
