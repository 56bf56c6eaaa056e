"""Shared pieces of the bound-agent tests: histories, generation, forward counting, state checks.

`AgentView` records everything a caller can observe about an agent (its state object and
tensors, history/retained mode, pending continuation and queue) so a test can assert that
a failed or cancelled call left all of it as it was. It reads private attributes on
purpose: the public `inspect()` summarises counts, and identity is the stronger check.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone, cache_layers, cache_length

from tests.helpers.holding import wait_for_cancel

DOC = (
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. "
    "The Birch project is owned by Bob and launched on 9 June 2019 in Lima."
)
HISTORY_A = [
    {"role": "system", "content": "You are agent A. You keep project records."},
    {"role": "user", "content": DOC},
    {"role": "assistant", "content": "Noted: Cedar is owned by Alice."},
]
HISTORY_B = [{"role": "system", "content": "You are agent B. You answer questions."}]
HISTORY_C = [{"role": "system", "content": "You are agent C. You summarise answers."}]
QUESTION = "Who owns Cedar?"


def history(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """A fresh copy, so a test may edit its history without touching the module constant."""
    return [dict(message) for message in messages]


def ids_of(tokenizer: Any, text: str) -> torch.Tensor:
    return tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


def generate(model: Any, tokenizer: Any, inputs: dict[str, Any], **options: Any) -> Any:
    """Greedy native generation from a pop()/inputs() dictionary, as a user loop would call it."""
    with torch.no_grad():
        return model.generate(
            **inputs, do_sample=False, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id, **options
        )


def generate_ids(model: Any, tokenizer: Any, ids: torch.Tensor, max_new_tokens: int = 4) -> Any:
    with torch.no_grad():
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )


def same_cache(a: Any, b: Any, atol: float = 1e-5) -> bool:
    return cache_length(a) == cache_length(b) and all(
        torch.allclose(ka, kb, atol=atol) and torch.allclose(va, vb, atol=atol)
        for (ka, va), (kb, vb) in zip(cache_layers(a), cache_layers(b))
    )


@contextlib.contextmanager
def prompts_alone(model: Any):
    """Within the block, `model` prefills every prompt alone and whole (shared prefixes and
    batched prefills off, issue 28): for tests that count or intercept prompt forwards."""
    import rclc

    before = rclc.configure_batching(model)
    rclc.configure_batching(model, shared_prefixes=False, prefill_batch=1)
    try:
        yield
    finally:
        rclc.configure_batching(model, before)


@contextlib.contextmanager
def counted_forwards(model: Any, *, delay: float = 0.0, held_until: threading.Event | None = None):
    """Record the number of positions of every decoder forward (optionally slowing each one).

    The hook sits on the decoder stack, which every rclc forward and native generation
    step goes through; the list it yields grows by one entry per forward. `held_until`: every
    forward waits until the test sets it (once it has cancelled the caller) or the caller's
    cancellation reached the forward (at most 60 s), so a test that cancels mid-operation
    never races a clock: the operation cannot end before the cancellation.
    """
    calls: list[int] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        rows = kwargs.get("inputs_embeds")
        if rows is None:
            rows = kwargs.get("input_ids")
        calls.append(int(rows.shape[1]) if rows is not None else -1)
        if delay:
            time.sleep(delay)
        if held_until is not None:
            wait_for_cancel(model, released=held_until)

    handle = backbone(model).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


@dataclass
class AgentView:
    state: Any
    rows: torch.Tensor | None
    ids: torch.Tensor | None
    cache_length: int
    from_history: bool
    pending: Any
    queue: list[Any]
    report: dict[str, Any]


def view(agent: Any) -> AgentView:
    state = agent._state
    return AgentView(
        state=state,
        rows=None if state is None else state.input_embeds.clone(),
        ids=None if state is None or state.token_ids is None else state.token_ids.clone(),
        cache_length=0 if state is None else cache_length(state.past_key_values),
        from_history=agent._from_history,
        pending=agent._pending,
        queue=list(agent._queue),
        report=agent.inspect(selection=True),
    )


def assert_unchanged(agent: Any, before: AgentView) -> None:
    """The agent holds the very same state, pending continuation and queue as in `before`."""
    state = agent._state
    assert state is before.state, "the agent's state object was replaced"
    if state is not None:
        assert torch.equal(state.input_embeds, before.rows), "the state's rows were modified in place"
        if before.ids is not None:
            assert torch.equal(state.token_ids, before.ids), "the state's token IDs were modified in place"
        assert cache_length(state.past_key_values) == before.cache_length, "the state's cache was extended"
    assert agent._from_history is before.from_history
    assert agent._pending is before.pending, "the pending continuation changed"
    assert len(agent._queue) == len(before.queue)
    assert all(a is b for a, b in zip(agent._queue, before.queue)), "the queue changed"
    assert agent.inspect(selection=True) == before.report
