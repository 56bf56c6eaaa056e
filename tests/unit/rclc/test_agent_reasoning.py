"""Reasoning through transfer with bound agents, custom methods, and a chain of three agents."""

from __future__ import annotations

import dataclasses
import math
import threading
from functools import partial

import anyio
import pytest
import torch

import rclc
from rclc import latent_mass, latent_mass_sync, transfer, transfer_sync
from tests.helpers.agents import DOC, HISTORY_A, HISTORY_B, HISTORY_C, QUESTION, generate, history

LONG = " ".join([DOC] * 4)  # 152 tokens with the tiny tokenizer: longer than the 128 budget


def _long_sender(model, tokenizer):
    return rclc.bind(model, tokenizer, prompt=LONG)


def _receiver(model, tokenizer):
    return rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=8)


def _selection(agent, index=0):
    return agent.inspect(selection=True)["deliveries"][index]["selection"][0]


# ---------------------------------------------------------------------------------------
# Budget arithmetic (api.md "Reasoning")


@pytest.mark.parametrize("context", ["selected", "selected_with_request"])
def test_selected_context_reserves_the_reasoning_rows(tiny, context):
    """api.md: with steps=50, reasoning_budget=50 and budget=128, at most 78 source rows are selected."""
    model, tokenizer = tiny
    sender, receiver = _long_sender(model, tokenizer), _receiver(model, tokenizer)
    total = sender.sender_state().positions
    assert total >= 128
    transfer_sync(
        sender, receiver, QUESTION, budget=128, record_selection=True,
        reasoning=partial(rclc.latent_mass, steps=50), reasoning_context=context, reasoning_budget=50,
    )
    record = _selection(receiver)
    assert len(record["indices"]) == 78
    assert record["added_latent_positions"] == 50 and record["budget"] == 128
    assert record["source_positions"] == total, "post-selection reasoning has no source index"
    assert receiver.inspect()["deliveries"][0]["retained_positions"] == [128]
    state = sender.sender_state()
    assert state.positions == total and state.latent_steps == 0, "the sender's own state is untouched"


def test_selected_context_does_not_refill_unused_rows(tiny):
    model, tokenizer = tiny
    sender, receiver = _long_sender(model, tokenizer), _receiver(model, tokenizer)
    total = sender.sender_state().positions
    transfer_sync(
        sender, receiver, QUESTION, ratio=4, record_selection=True,
        reasoning=partial(latent_mass, steps=5), reasoning_context="selected", reasoning_budget=8,
    )
    cap = math.ceil((total + 8) / 4)
    record = _selection(receiver)
    assert len(record["indices"]) == cap - 8 and record["added_latent_positions"] == 5
    assert receiver.inspect()["deliveries"][0]["retained_positions"] == [cap - 8 + 5]


@pytest.mark.parametrize("context", ["full", "full_with_request"])
@pytest.mark.parametrize("ratio,budget", [(4, None), (None, 20)])
def test_full_context_extends_the_state_before_the_budget(tiny, context, ratio, budget):
    model, tokenizer = tiny
    sender = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    receiver = _receiver(model, tokenizer)
    total, steps = sender.sender_state().positions, 6
    transfer_sync(
        sender, receiver, QUESTION, ratio=ratio, budget=budget, record_selection=True,
        reasoning=partial(latent_mass, steps=steps), reasoning_context=context, reasoning_budget=10,
    )
    extended = total + steps
    cap = math.ceil(extended / 4) if ratio else min(budget, extended)
    record = _selection(receiver)
    assert record["source_positions"] == extended and record["added_latent_positions"] == 0
    assert len(record["indices"]) == cap
    assert set(range(total, extended)) <= set(record["indices"]), "built-in selectors keep the new latent tail"
    latent_spans = [span for span in record["spans"] if span["kind"] == "latent"]
    assert [(s["start"], s["stop"], s["kept"]) for s in latent_spans] == [(total, extended, True)]
    assert sender.sender_state().latent_steps == 0


def test_full_with_request_conditions_on_each_request(tiny):
    model, tokenizer = tiny
    sender = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    got = []
    requests = [QUESTION, "When did Birch launch?"]
    transfer_sync(sender, got.append, requests, ratio=1, reasoning=partial(latent_mass, steps=4))
    transfer_sync(
        sender, got.append, requests, ratio=1, reasoning=partial(latent_mass, steps=4),
        reasoning_context="full_with_request",
    )
    plain = [d.messages[0].continuous_rows[-4:] for d in got[:2]]
    conditioned = [d.messages[0].continuous_rows[-4:] for d in got[2:]]
    assert torch.equal(plain[0], plain[1]), "full runs once per sender"
    assert not torch.allclose(conditioned[0], conditioned[1]), "full_with_request runs per request"
    assert not torch.allclose(plain[0], conditioned[0])


def test_full_reasoning_budget_caps_new_rows(tiny):
    model, tokenizer = tiny
    sender, receiver = rclc.bind(model, tokenizer, messages=history(HISTORY_A)), _receiver(model, tokenizer)
    with pytest.raises(ValueError, match="max_positions"):
        transfer_sync(sender, receiver, QUESTION, reasoning=partial(latent_mass, steps=6), reasoning_budget=5)
    assert len(receiver) == 0


@pytest.mark.parametrize(
    "options,match",
    [
        ({"reasoning_budget": 4}, "reasoning"),
        ({"reasoning_context": "full"}, "reasoning"),
        ({"reasoning": partial(latent_mass, steps=1), "reasoning_context": "later"}, "reasoning_context"),
        ({"reasoning": partial(latent_mass, steps=1), "reasoning_context": "selected"}, "reasoning_budget"),
        ({"reasoning": partial(latent_mass, steps=1), "reasoning_budget": -1}, "reasoning_budget"),
        ({"reasoning": "latent"}, "callable"),
    ],
)
def test_reasoning_option_errors_deliver_nothing(tiny, options, match):
    model, tokenizer = tiny
    sender, receiver = rclc.bind(model, tokenizer, prompt=DOC), _receiver(model, tokenizer)
    with pytest.raises(ValueError, match=match):
        transfer_sync(sender, receiver, QUESTION, **options)
    assert len(receiver) == 0


# ---------------------------------------------------------------------------------------
# Custom methods


def test_custom_sync_and_async_methods(tiny):
    model, tokenizer = tiny
    sender, receiver = rclc.bind(model, tokenizer, prompt=DOC), _receiver(model, tokenizer)
    seen = []

    def sync_method(state, *, max_positions, request=None):
        seen.append(("sync", threading.get_ident(), max_positions, request is not None))
        return latent_mass_sync(state, steps=min(3, max_positions), request=request)

    async def async_method(state, *, max_positions, request=None):
        seen.append(("async", threading.get_ident(), max_positions, request is not None))
        await anyio.sleep(0)
        return await latent_mass(state, steps=min(3, max_positions), request=request)

    async def main():
        for method in (sync_method, async_method):
            await transfer(
                sender, receiver, QUESTION, ratio=1, record_selection=True,
                reasoning=method, reasoning_context="selected_with_request", reasoning_budget=3,
            )
        return threading.get_ident()

    loop_thread = anyio.run(main)
    assert [(kind, maximum, req) for kind, _, maximum, req in seen] == [("sync", 3, True), ("async", 3, True)]
    assert seen[0][1] != loop_thread, "sync methods run in a worker"
    assert seen[1][1] == loop_thread, "async methods run on the caller's loop"
    assert len(receiver) == 2
    for index in range(2):
        assert _selection(receiver, index)["added_latent_positions"] == 3


def _spoil(kind):
    """A custom method that returns an invalid extension of the state it gets."""

    def method(state, *, max_positions, request=None):
        result = latent_mass_sync(state, steps=2)
        if kind == "nonfinite":
            rows = result.input_embeds.clone()
            rows[-1] = float("nan")
            return dataclasses.replace(result, input_embeds=rows)
        if kind == "prefix":
            rows = result.input_embeds.clone()
            rows[0] += 1.0
            return dataclasses.replace(result, input_embeds=rows)
        if kind == "inherited":
            return dataclasses.replace(result, inherited_positions=result.inherited_positions + 1)
        if kind == "latent":
            return dataclasses.replace(result, latent_steps=state.latent_steps + 1)
        if kind == "type":
            return {"state": result}
        if kind == "too_many":
            return latent_mass_sync(state, steps=max_positions + 1)
        raise AssertionError(kind)

    return method


@pytest.mark.parametrize(
    "kind,match",
    [
        ("nonfinite", "finite"),
        ("prefix", "prefix"),
        ("inherited", "inherited"),
        ("latent", "latent_steps"),
        ("type", "SenderState"),
        ("too_many", "max_positions"),
    ],
)
def test_invalid_custom_results_deliver_nothing(tiny, kind, match):
    model, tokenizer = tiny
    sender, receiver = rclc.bind(model, tokenizer, prompt=DOC), _receiver(model, tokenizer)
    got = []
    with pytest.raises(ValueError, match=match):
        transfer_sync(sender, [receiver, got.append], QUESTION, reasoning=_spoil(kind), reasoning_budget=3)
    assert len(receiver) == 0 and got == []
    assert sender.sender_state().positions == rclc.sender_from_hf(model, tokenizer, DOC).positions


def test_a_late_invalid_result_still_delivers_nothing(tiny):
    model, tokenizer = tiny
    sender, receiver = rclc.bind(model, tokenizer, prompt=DOC), _receiver(model, tokenizer)
    calls = []

    async def second_call_fails(state, *, max_positions, request=None):
        calls.append(request)
        if len(calls) == 2:
            raise RuntimeError("tool unavailable")
        return await latent_mass(state, steps=1, request=request)

    with pytest.raises(RuntimeError, match="tool unavailable"):
        transfer_sync(
            sender, receiver, [QUESTION, "Second?"], reasoning=second_call_fails,
            reasoning_context="full_with_request",
        )
    assert len(calls) == 2 and len(receiver) == 0


# ---------------------------------------------------------------------------------------
# A chain of three agents


@pytest.mark.parametrize("ratio", [2, 4])
def test_chain_of_three_agents_inherits_hop_by_hop(tiny, ratio):
    """Inherited positions follow I + ceil((T - I) / r) at every hop: A -> B -> C -> sink."""
    model, tokenizer = tiny
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=5)
    c = rclc.bind(model, tokenizer, messages=history(HISTORY_C), max_new_tokens=5)

    def expected(state):
        inherited = state.inherited_positions
        return inherited + math.ceil((state.positions - inherited) / ratio)

    hops = []
    sender = a
    for receiver in (b, c):
        state = sender.sender_state()
        sent = expected(state)
        transfer_sync(sender, receiver, QUESTION, ratio=ratio)
        assert receiver.inspect()["deliveries"][0]["retained_positions"] == [sent]
        inputs = receiver.pop()
        receiver.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
        report, new = receiver.inspect(), receiver.sender_state()
        assert new.inherited_positions == report["inherited_positions"] == sent
        assert report["cached_positions"] == new.positions > inputs["inputs_embeds"].shape[1]
        # every row keeps a token ID, inherited ones too (the senders' IDs travel with the rows),
        # and each named row is exactly that token's embedding
        assert bool((new.token_ids >= 0).all())
        weight = model.get_input_embeddings().weight
        assert torch.equal(new.input_embeds[:sent], weight[new.token_ids[:sent]])
        assert set(new.token_ids[:sent].tolist()) <= set(state.token_ids.tolist())
        hops.append((state.inherited_positions, state.positions, sent))
        sender = receiver

    sink = []
    final = c.sender_state()
    transfer_sync(c, sink.append, QUESTION, ratio=ratio)
    assert sink[0].messages[0].positions == expected(final)
    hops.append((final.inherited_positions, final.positions, sink[0].messages[0].positions))
    # Relative memory grows by the compressed new rows each hop.
    assert hops[0][0] == 0 and hops[1][0] == hops[0][2] and hops[2][0] == hops[1][2]
    assert hops[0][2] < hops[1][2] < hops[2][2]


def test_bounded_chain_stops_growing(tiny):
    model, tokenizer = tiny
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=5)
    transfer_sync(a, b, QUESTION, budget=12)
    inputs = b.pop()
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    sink = []
    transfer_sync(b, sink.append, QUESTION, budget=12)
    assert b.sender_state().inherited_positions == 12 and sink[0].messages[0].positions == 12
