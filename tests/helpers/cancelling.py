"""Cancelling a run at a chosen point and checking what it left (issue 6, item 2); shared by
tests/unit/rclc_graph/run/test_graph_cancel.py (hypothesis picks points) and
tests/integration/test_cancel_points.py (every point of the graph)."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import torch
import transformers

import rclc
import rclc_graph
from rclc import testing
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone, cache_layers
# private on purpose: the worker thread's cancellation internals under test
from rclc._worker import stop_requested
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors._attention_capture import reachable_configs
from rclc_graph import EventStream, LocalExecutor, ModelPool, ModelSpec, compile_plan, load_graph_text
from rclc_graph.run.scheduler import run_plan

from tests.helpers.reliability import SIX_INPUTS, SIX_YAML

CANCEL_YAML = (
    SIX_YAML.replace("SOURCE", "embedded")
    .replace("MAXNEW", "10")
    .replace("{source: a, target: c, policy: {ratio: 2}}", "{source: a, target: c, policy: {ratio: 2, reasoning: {steps: 3}}}")
)
# The packages whose code means "computing": their installed directories, not name fragments
# (a checkout cloned under a folder named rclc would make every test file look busy).
_BUSY_PARTS = tuple(str(Path(module.__file__).parent) + os.sep for module in (rclc, rclc_graph, torch, transformers))


def cancel_plan():
    return compile_plan(load_graph_text(CANCEL_YAML), SIX_INPUTS)


def busy_threads() -> list[str]:
    """Threads (other than this one) whose stack is inside model or library code."""
    frames = sys._current_frames()
    busy = []
    for thread in threading.enumerate():
        if thread is threading.current_thread():
            continue
        frame = frames.get(thread.ident)
        files = []
        while frame is not None:
            files.append(frame.f_code.co_filename)
            frame = frame.f_back
        if any(name.startswith(_BUSY_PARTS) for name in files):
            busy.append(f"{thread.name}: {files[:3]}")
    return busy


ENGINE_THREADS = "rclc-batching-"  # the batching engine's prefill and decode threads (hf_batching.py)


async def busy_after_cancel(grace: float = 5.0) -> list[str]:
    """`busy_threads()` right after a cancelled run returned.

    Every worker a run started must be done by then (sampled once, at once). The batching
    engine's threads are not a run's workers: they finish the step that saw the cancelled
    sequence's stop, then leave when no sequence is left, a loop turn after the cancelled
    call returned. They get `grace` seconds to go idle; still busy after that is a failure.
    """
    busy = busy_threads()
    workers = [entry for entry in busy if not entry.startswith(ENGINE_THREADS)]
    deadline = anyio.current_time() + grace
    engine = [entry for entry in busy if entry.startswith(ENGINE_THREADS)]
    while engine and anyio.current_time() < deadline:
        await anyio.sleep(0.01)
        engine = [entry for entry in busy_threads() if entry.startswith(ENGINE_THREADS)]
    return workers + engine


class WatchingExecutor(LocalExecutor):
    """Remembers every agent it binds and the exact state each finished node left."""

    def __init__(self, pool):
        super().__init__(pool)
        self.bound: dict[str, object] = {}
        self.finished_state: dict[str, tuple] = {}
        self.contexts: list = []

    def bind(self, ctx, node):
        agent = super().bind(ctx, node)
        self.bound[node.name] = agent
        return agent

    async def run_node(self, ctx, node, inbound):
        self.contexts.append(ctx)
        result = await super().run_node(ctx, node, inbound)
        # In a worker, as LocalExecutor reads states: sender_state takes the preparation lock,
        # which another node's worker may hold while its forward hook (Trigger.cancel) waits
        # for this event loop; taking the lock on the loop would deadlock.
        # Shielded, so a cancellation landing now is seen where it was before: after this node.
        with anyio.CancelScope(shield=True):
            state = await anyio.to_thread.run_sync(self.agent(ctx.run_id, node.name).sender_state)
        self.finished_state[node.name] = (
            state.input_embeds.clone(),
            [(keys.clone(), values.clone()) for keys, values in cache_layers(state.past_key_values)],
            state.positions,
        )
        return result


@dataclass
class Trigger:
    """Cancels the run's scope at the k-th forward or event and watches what follows."""

    mode: str
    k: int
    scope: anyio.CancelScope | None = None
    token: object = None
    forwards: int = 0
    requested: bool = False
    after_request: int = 0
    after_stop: int = 0
    executor: WatchingExecutor | None = None
    events: list = field(default_factory=list)

    def cancel(self) -> None:
        if self.requested:
            return
        self.requested = True
        if threading.current_thread() is threading.main_thread():
            self.scope.cancel()
        else:
            anyio.from_thread.run_sync(self.scope.cancel, token=self.token)

    def forward(self, module, args) -> None:
        if self.requested:
            self.after_request += 1
            if stop_requested():  # this worker's caller was cancelled before this forward began
                self.after_stop += 1
        self.forwards += 1
        if self.mode == "forward" and self.forwards == self.k:
            self.cancel()

    def event(self, event) -> None:
        self.events.append(event)
        if self.mode == "event" and len(self.events) == self.k:
            self.cancel()


@dataclass
class Outcome:
    cancelled: bool
    trigger: Trigger
    events: list
    stats: object
    epoch: int
    executor: WatchingExecutor
    again: object
    busy: list


def cancel_once(pool, model, plan, mode: str, k: int) -> Outcome:
    trigger = Trigger(mode, k)
    handle = backbone(model).register_forward_pre_hook(trigger.forward)
    events = EventStream(max_events=16, max_bytes=16384)
    executor = WatchingExecutor(pool)
    trigger.executor = executor

    async def main():
        trigger.token = anyio.lowlevel.current_token()

        async def consume():
            async for event in events:
                trigger.event(event)

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            with anyio.CancelScope() as scope:
                trigger.scope = scope
                await run_plan(plan, pool=pool, executor=executor, events=events, run_id="cancelled-run")
            busy = await busy_after_cancel()
            handle.remove()
            again = await run_plan(plan, pool=pool, events=events, run_id="next-run")
            events.close()
        return scope.cancelled_caught, busy, again

    try:
        cancelled, busy, again = anyio.run(main)
    finally:
        handle.remove()
    return Outcome(cancelled, trigger, trigger.events, events.stats(), 1, executor, again, busy)


def check(outcome: Outcome, model, reference_outputs) -> None:
    trigger, executor = outcome.trigger, outcome.executor
    assert outcome.busy == [], outcome.busy
    assert outcome.again.status == "finished" and outcome.again.outputs == reference_outputs
    for config in reachable_configs(model):
        assert config._attn_implementation == "sdpa"
    retired = [event for event in outcome.events if event.epoch == outcome.epoch]
    notices = [index for index, event in enumerate(retired) if event.kind == "cancelled"]
    if not outcome.cancelled:  # the run finished before the chosen point
        assert notices == []
        return
    assert len(notices) == 1 and retired[-1].kind == "cancelled", [event.kind for event in retired[-3:]]
    assert outcome.epoch in outcome.stats.retired_epochs
    # within one model step: at most the generation step being decided when the stop landed
    assert trigger.after_stop <= 1, (trigger.after_request, trigger.after_stop)
    finished = {event.payload["node"] for event in retired if event.kind == "node" and event.payload["status"] == "finished"}
    assert finished <= set(executor.finished_state)
    assert not any(run == "cancelled-run" for run, _ in executor._agents)  # released
    for name, agent in executor.bound.items():
        report = agent.inspect()
        if name in executor.finished_state:
            rows, layers, positions = executor.finished_state[name]
            state = agent.sender_state()
            assert torch.equal(state.input_embeds, rows) and state.positions == positions
            for (keys, values), (old_keys, old_values) in zip(cache_layers(state.past_key_values), layers):
                assert torch.equal(keys, old_keys) and torch.equal(values, old_values)
            assert report["queued_requests"] == 0 and not report["pending_generation"]


def cancel_setup(family: str) -> dict:
    """A tiny model in a pool, the plan, its uninterrupted outputs and how many forwards and
    events a whole run has (the ranges cancellation points are drawn from)."""
    model, tokenizer = testing.tiny_model(family)
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    plan = cancel_plan()
    counting = Trigger("none", 0)
    handle = backbone(model).register_forward_pre_hook(counting.forward)
    try:
        reference = anyio.run(lambda: run_plan(plan, pool=pool))
    finally:
        handle.remove()
    assert reference.status == "finished", reference.error
    events = EventStream(max_events=10_000)

    async def count_events():
        await run_plan(plan, pool=pool, events=events)
        return events.stats().published

    total_events = anyio.run(count_events)
    return {"pool": pool, "model": model, "plan": plan, "outputs": reference.outputs,
            "forwards": counting.forwards, "events": total_events}
