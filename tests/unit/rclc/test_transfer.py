from __future__ import annotations

import functools
import math
import threading
import time

import anyio
import pytest
import torch

import rclc
from rclc import HFReceiver, sender_from_hf, transfer, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers
from rclc.state import Delivery

DOCS = [
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo.",
    "The Birch project is owned by Bob and launched on 9 June 2019 in Lima.",
]


def first_positions(sender, request_ids, budget):
    """A custom selector: the first `budget` positions."""
    return list(range(budget))


@pytest.fixture
def senders(tiny):
    model, tokenizer = tiny
    return [sender_from_hf(model, tokenizer, doc) for doc in DOCS]


def _snapshot(state):
    return (
        state.input_embeds.clone(),
        None if state.token_ids is None else state.token_ids.clone(),
        [(k.clone(), v.clone()) for k, v in cache_layers(state.past_key_values)],
    )


def _unchanged(state, snap):
    rows, ids, layers = snap
    return (
        torch.equal(state.input_embeds, rows)
        and (ids is None or torch.equal(state.token_ids, ids))
        and all(torch.equal(k, kb) and torch.equal(v, vb) for (k, v), (kb, vb) in zip(cache_layers(state.past_key_values), layers))
    )


def test_broadcast_shape_and_callback_order(senders):
    calls = []

    def sync_cb(delivery):
        calls.append(("sync", delivery.request))

    async def async_cb(delivery):
        await anyio.sleep(0)
        calls.append(("async", delivery.request))

    got = []
    transfer_sync(senders, [sync_cb, async_cb, got.append], ["Who owns Cedar?", "When did Birch launch?"], selector=first_positions)
    assert calls == [
        ("sync", "Who owns Cedar?"), ("async", "Who owns Cedar?"),
        ("sync", "When did Birch launch?"), ("async", "When did Birch launch?"),
    ]
    assert len(got) == 2 and all(len(d.messages) == 2 for d in got)


@pytest.mark.parametrize("options,expect", [({}, lambda t: math.ceil(t / 4)), ({"ratio": 2}, lambda t: math.ceil(t / 2)), ({"budget": 6}, lambda t: min(6, t))])
def test_budget_modes(senders, options, expect):
    got = []
    transfer_sync(senders, got.append, "Who owns Cedar?", selector=first_positions, **options)
    (delivery,) = got
    for state, message in zip(senders, delivery.messages):
        assert message.positions == expect(state.positions)
        assert torch.equal(message.continuous_rows, state.input_embeds[: message.positions].cpu())
        # the rows travel whole; the sender's token IDs of those rows travel beside them (8 bytes each)
        assert torch.equal(message.source_ids, state.token_ids[: message.positions].cpu())
        assert message.nbytes == message.continuous_rows.numel() * message.continuous_rows.element_size() + 8 * message.positions


def test_default_selector_is_cacheback_and_state_is_untouched(senders):
    snaps = [_snapshot(s) for s in senders]
    got = []
    transfer_sync(senders, got.append, "Who owns Cedar?", record_selection=True)
    for state, snap, message in zip(senders, snaps, got[0].messages):
        assert _unchanged(state, snap)
        assert state.model.config._attn_implementation == "sdpa"
        selection = message.selection
        assert selection.source_positions == state.positions
        assert len(selection.indices) == message.positions == math.ceil(state.positions / 4)
        assert sum(span.stop - span.start for span in selection.spans) == state.positions
        assert 0 in selection.indices


def test_receiver_fitting_shrinks_budgets(tiny, senders):
    model, tokenizer = tiny
    receiver = HFReceiver(model, tokenizer, max_new_tokens=4)
    prepared = receiver.prepare_request("Who owns Cedar?")
    room = 10
    tight = HFReceiver(model, tokenizer, max_new_tokens=4, context_limit=prepared.input_ids.shape[1] + 4 + room)
    got = []
    transfer_sync(senders, [tight, got.append], "Who owns Cedar?", ratio=1, selector=first_positions)
    counts = [m.positions for m in got[0].messages]
    assert counts == [5, 5]
    assert len(tight) == 1
    inputs = tight.pop()
    assert inputs["inputs_embeds"].shape[1] == room + prepared.input_ids.shape[1]


def test_impossible_budget_delivers_nothing(tiny, senders):
    model, tokenizer = tiny
    tight = HFReceiver(model, tokenizer, context_limit=12)
    got = []
    with pytest.raises(ValueError, match="handoff positions"):
        transfer_sync(senders, [got.append, tight], "Who owns Cedar?", selector=first_positions)
    assert got == [] and len(tight) == 0


def test_failure_in_a_later_request_delivers_nothing(senders):
    calls = {"n": 0}

    def flaky(sender, request_ids, budget):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("selector exploded")
        return list(range(budget))

    got = []
    with pytest.raises(RuntimeError, match="exploded"):
        transfer_sync(senders, got.append, ["q one", "q two"], selector=flaky)
    assert got == []


def test_callback_exception_keeps_earlier_deliveries(senders):
    got = []

    def boom(delivery):
        raise KeyError("callback failed")

    with pytest.raises(KeyError):
        transfer_sync(senders, [got.append, boom], ["q one", "q two"], selector=first_positions)
    assert len(got) == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"ratio": 2, "budget": 3}, "not both"),
        ({"ratio": 0}, "ratio"),
        ({"budget": 1.5}, "budget"),
        ({"reasoning_budget": 3}, "reasoning"),
        ({"reasoning_context": "full"}, "reasoning"),
        ({"reasoning": 3}, "reasoning"),
        ({"reasoning": rclc.latent_mass, "reasoning_context": "nowhere"}, "reasoning_context"),
        ({"reasoning": rclc.latent_mass, "reasoning_context": "selected"}, "reasoning_budget"),
        ({"reasoning": rclc.latent_mass, "reasoning_budget": -1}, "reasoning_budget"),
        ({"selector": 5}, "selector"),
        ({"representation": "pixels"}, "representation"),
        ({"record_selection": 1}, "record_selection"),
    ],
)
def test_option_errors(senders, kwargs, match):
    got = []
    with pytest.raises(ValueError, match=match):
        transfer_sync(senders, got.append, "Who owns Cedar?", **kwargs)
    assert got == []


def test_routing_errors(senders, tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="sender"):
        transfer_sync([], print, "q")
    with pytest.raises(ValueError, match="sender"):
        transfer_sync(["not a sender"], print, "q")
    with pytest.raises(ValueError, match="receiver"):
        transfer_sync(senders, [], "q")
    with pytest.raises(ValueError, match="receiver"):
        transfer_sync(senders, [print, 3], "q")
    with pytest.raises(ValueError, match="request"):
        transfer_sync(senders, print, [])
    with pytest.raises(ValueError, match="request"):
        transfer_sync(senders, print, "   ")
    with pytest.raises(ValueError, match="int64"):
        transfer_sync(senders, print, torch.tensor([[1, 2]], dtype=torch.int32))
    bare = sender_from_hf(model, None, torch.tensor([[5, 6, 7, 8]]))
    with pytest.raises(ValueError, match="tokenizer"):
        transfer_sync(bare, print, "text needs a tokenizer")


def test_state_validation_errors(senders):
    state = senders[0]
    broken = rclc.SenderState(state.model, state.past_key_values, state.input_embeds[:-1], state.tokenizer)
    with pytest.raises(ValueError, match="past_key_values"):
        transfer_sync(broken, print, "q")
    for kwargs, match in [
        ({"latent_steps": state.positions}, "latent_steps"),
        ({"inherited_positions": -1}, "inherited_positions"),
        ({"token_ids": state.token_ids[:-1]}, "token_ids"),
        ({"input_embeds": state.input_embeds.double()}, "input_embeds"),
    ]:
        fields = dict(model=state.model, past_key_values=state.past_key_values, input_embeds=state.input_embeds,
                      tokenizer=state.tokenizer, token_ids=state.token_ids)
        fields.update(kwargs)
        with pytest.raises(ValueError, match=match):
            transfer_sync(rclc.SenderState(**fields), print, "q")


def test_receiver_model_mismatch(tiny_qwen3, tiny_llama):
    sender = sender_from_hf(*tiny_qwen3, DOCS[0])
    receiver = HFReceiver(*tiny_llama)
    with pytest.raises(ValueError, match="model_type"):
        transfer_sync(sender, receiver, "q")
    assert len(receiver) == 0


@pytest.mark.parametrize(
    "result,match",
    [
        (torch.tensor([[0, 1]]), "selector"),
        (torch.tensor([0.0, 1.0]), "selector"),
        ("01", "selector"),
        ([0, True], "selector"),
        ([], "selector"),
        (list(range(50)), "selector"),
        ([0, 0], "selector"),
        ([0, 10**6], "selector"),
    ],
)
def test_invalid_selector_output(senders, result, match):
    got = []
    with pytest.raises(ValueError, match=match):
        transfer_sync(senders, got.append, "q", selector=lambda s, r, b: result)
    assert got == []


def test_mixed_representation_matches_dense(senders, tiny):
    model, _ = tiny
    dense, mixed = [], []
    transfer_sync(senders, dense.append, "Who owns Cedar?", selector=first_positions)
    with pytest.warns(UserWarning, match="experimental"):
        transfer_sync(senders, mixed.append, "Who owns Cedar?", selector=first_positions, representation="token_ids+continuous")
    weight = model.get_input_embeddings().weight
    for a, b in zip(dense[0].messages, mixed[0].messages):
        assert b.token_ids is not None and b.continuous_rows.shape[0] == 0
        assert torch.equal(a.materialize(weight), b.materialize(weight))
    assert torch.equal(dense[0].for_hf(weight)["inputs_embeds"], mixed[0].for_hf(weight)["inputs_embeds"])
    assert dense[0].for_vllm(weight)["prompt_embeds"].device.type == "cpu"


def test_transfer_sync_works_inside_a_running_loop(senders):
    # issue 15 item 1: it used to refuse (anyio's "Already running asyncio in this thread");
    # now it runs on a loop of its own in a worker thread
    received = []

    async def inside():
        transfer_sync(senders, received.append, "q")

    anyio.run(inside)
    assert len(received) == 1 and len(received[0].messages) == len(senders)


def test_cancellation_waits_for_the_worker_and_delivers_nothing(senders):
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow(sender, request_ids, budget):
        started.set()
        release.wait(5)
        finished.set()
        return list(range(budget))

    got = []

    async def main():
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(transfer, senders, got.append, "q", selector=slow))
            await anyio.to_thread.run_sync(started.wait, 5)
            group.cancel_scope.cancel()
            threading.Timer(0.2, release.set).start()
        assert finished.is_set(), "cancellation returned before the worker finished"

    anyio.run(main)
    assert got == []
    again = []
    transfer_sync(senders, again.append, "q", selector=first_positions)
    assert len(again) == 1


def test_one_transfers_selections_run_one_after_another(senders):
    """Within one transfer the (sender, request) selections run in turn; selections of
    different transfers may overlap (tests/unit/rclc/test_forward_slots.py shows they do)."""
    active, peak, calls = [0], [0], [0]
    lock = threading.Lock()

    def blocking(sender, request_ids, budget):
        with lock:
            active[0] += 1
            calls[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return list(range(budget))

    transfer_sync(senders, [lambda d: None, lambda d: None], ["a", "b"], selector=blocking)
    assert calls[0] == 4 and peak[0] == 1


def test_delivery_requires_messages():
    with pytest.raises(ValueError, match="messages"):
        Delivery("q", ())
