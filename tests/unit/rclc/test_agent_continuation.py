"""Continuation of bound agents: pop, update, append and inputs, their failures and cancellation."""

from __future__ import annotations

import functools
import threading

import anyio
import pytest
import torch

import rclc
from rclc import transfer, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_length, generation_cache, prefill
from rclc.hf_senders import render_messages
from tests.helpers.agents import (
    DOC,
    HISTORY_A,
    HISTORY_B,
    QUESTION,
    assert_unchanged,
    counted_forwards,
    generate,
    generate_ids,
    history,
    ids_of,
    same_cache,
    view,
)


def _pair(model, tokenizer, **options):
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=6, **options)
    return a, b


def _received(model, tokenizer, requests=(QUESTION,), **options):
    """Agent B with one queued handoff from A per request."""
    a, b = _pair(model, tokenizer)
    transfer_sync(a, b, list(requests), **options)
    return a, b


def _continued(model, tokenizer):
    """Agent B after pop -> native generate -> update(inputs=, generation=)."""
    a, b = _received(model, tokenizer)
    inputs = b.pop()
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    return a, b


# ---------------------------------------------------------------------------------------
# pop / update(inputs=, generation=)


def test_second_pop_raises_until_update_records(tiny):
    model, tokenizer = tiny
    _, b = _received(model, tokenizer, requests=[QUESTION, "When did Birch launch?"])
    first = b.pop()
    assert b.inspect()["pending_generation"] and len(b) == 1
    before = view(b)
    with pytest.raises(ValueError, match="pending"):
        b.pop()
    assert_unchanged(b, before)
    b.update(inputs=first, generation=generate(model, tokenizer, first))
    assert not b.inspect()["pending_generation"]
    second = b.pop()
    assert len(b) == 0 and second is not first


def test_discard_pending_replaces_the_continuation(tiny):
    model, tokenizer = tiny
    _, b = _received(model, tokenizer, requests=[QUESTION, "When did Birch launch?"])
    stale = b.pop()
    fresh = b.pop(discard_pending=True)
    assert len(b) == 0 and b.inspect()["pending_generation"]
    before = view(b)
    with pytest.raises(ValueError, match="exact dictionary"):
        b.update(inputs=stale, generation=generate(model, tokenizer, stale))
    assert_unchanged(b, before)
    b.update(inputs=fresh, generation=generate(model, tokenizer, fresh))
    assert b.inspect()["state_source"] == "retained"
    with pytest.raises(ValueError, match="discard_pending"):
        b.pop(discard_pending=1)


def test_update_records_the_continuation(tiny):
    model, tokenizer = tiny
    _, b = _received(model, tokenizer)
    delivery, prepared = b.peek(0)
    received = delivery.positions
    inputs = b.pop()
    output = generate(model, tokenizer, inputs)
    cache_before = cache_length(generation_cache(output))
    b.update(inputs=inputs, generation=output)
    state = b.sender_state()
    new = output.sequences[0]
    weight = model.get_input_embeddings().weight
    assert state.positions == inputs["inputs_embeds"].shape[1] + new.shape[0]
    assert torch.equal(state.input_embeds[: inputs["inputs_embeds"].shape[1]], inputs["inputs_embeds"][0])
    assert torch.equal(state.input_embeds[inputs["inputs_embeds"].shape[1] :], weight[new])
    # Received rows keep the sender's IDs (they are exactly the receiver's embeddings of those
    # tokens); the receiver prompt and the generated tokens keep theirs.
    sent_ids = torch.cat([message.source_ids for message in delivery.messages])
    assert bool((sent_ids >= 0).all()) and torch.equal(state.input_embeds[:received], weight[sent_ids])
    expected_ids = torch.cat([sent_ids, prepared.input_ids[0], new])
    assert torch.equal(state.token_ids, expected_ids)
    assert state.inherited_positions == received and state.latent_steps == 0
    assert same_cache(state.past_key_values, prefill(model, state.input_embeds))
    assert cache_length(generation_cache(output)) == cache_before, "the generate output's cache was not extended"
    report = b.inspect()
    assert report["inherited_positions"] == received and report["cached_positions"] == state.positions


def test_mixed_payload_keeps_known_ids(tiny):
    model, tokenizer = tiny
    a, b = _pair(model, tokenizer)
    with pytest.warns(UserWarning, match="experimental"):
        transfer_sync(a, b, QUESTION, representation="token_ids+continuous")
    message = b.peek(0)[0].messages[0]
    inputs = b.pop()
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    state = b.sender_state()
    assert torch.equal(state.token_ids[: message.positions], message.token_ids)
    assert bool((state.token_ids >= 0).all()), "a token-only handoff leaves no continuous rows"
    assert state.inherited_positions == message.positions


def test_update_with_ids_and_cache(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    ids = ids_of(tokenizer, DOC)
    cache = prefill(model, model.get_input_embeddings().weight[ids[0]])
    agent.update(ids, past_key_values=cache)
    state = agent.sender_state()
    assert state.past_key_values is cache and torch.equal(state.token_ids, ids[0])
    assert agent.inspect()["state_source"] == "retained"

    output = generate_ids(model, tokenizer, ids)
    agent.update(generation=output)
    assert torch.equal(agent.sender_state().token_ids, output.sequences[0])


def test_update_without_arguments_returns_to_history(tiny):
    model, tokenizer = tiny
    _, b = _continued(model, tokenizer)
    b.update()
    report = b.inspect()
    assert report["state_source"] == "messages" and report["cached_positions"] == 0
    assert torch.equal(b.sender_state().token_ids, render_messages(tokenizer, HISTORY_B, generation_prompt=False)[0])


def test_update_clears_a_pending_continuation(tiny):
    model, tokenizer = tiny
    _, b = _received(model, tokenizer)
    b.pop()
    b.update(DOC)
    assert not b.inspect()["pending_generation"]
    assert torch.equal(b.sender_state().token_ids, ids_of(tokenizer, DOC)[0])


def test_update_failures_keep_state_pending_and_queue(tiny):
    model, tokenizer = tiny
    _, b = _received(model, tokenizer, requests=[QUESTION, "Second?"])
    inputs = b.pop()
    output = generate(model, tokenizer, inputs)
    token_output = generate_ids(model, tokenizer, ids_of(tokenizer, "Hi"))
    with torch.no_grad():
        beams = model.generate(
            **inputs, num_beams=2, do_sample=False, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id
        )
    edited = dict(inputs)
    edited["inputs_embeds"] = inputs["inputs_embeds"][:, :-1]
    cases = [
        ({"inputs": dict(inputs), "generation": output}, "exact dictionary"),
        ({"inputs": inputs, "generation": output, "prompt": DOC}, "only generation"),
        ({"inputs": inputs, "generation": output, "past_key_values": generation_cache(output)}, "only generation"),
        ({"inputs": inputs}, "generation: required"),
        ({"inputs": inputs, "generation": "text"}, "generation"),
        ({"inputs": inputs, "generation": beams}, "beam"),
        ({"inputs": inputs, "generation": token_output}, "cache holds"),
        ({"generation": output}, "pending"),
    ]
    for options, match in cases:
        before = view(b)
        prompt = options.pop("prompt", None)
        with pytest.raises(ValueError, match=match):
            b.update(prompt, **options)
        assert_unchanged(b, before)
    # A dictionary whose rows were replaced in place of the originals is refused too.
    saved = inputs["inputs_embeds"]
    inputs["inputs_embeds"] = saved[:, :-1]
    before = view(b)
    with pytest.raises(ValueError, match="inputs_embeds"):
        b.update(inputs=inputs, generation=output)
    assert_unchanged(b, before)
    inputs["inputs_embeds"] = saved
    b.update(inputs=inputs, generation=output)
    assert len(b) == 1 and not b.inspect()["pending_generation"]


def test_pop_failures_keep_the_queue(tiny):
    model, tokenizer = tiny
    a, b = _pair(model, tokenizer)
    with pytest.raises(IndexError, match="empty"):
        b.pop()
    transfer_sync(a, b, QUESTION)
    for options, error, match in [
        ({"max_new_tokens": 10**5}, ValueError, "context space"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"prompt": torch.tensor([[10**6]])}, ValueError, "prompt"),
        ({"deliveries": 2}, IndexError, "deliveries"),
    ]:
        before = view(b)
        with pytest.raises(error, match=match):
            b.pop(**options)
        assert_unchanged(b, before)
    inputs = b.pop(prompt="Answer briefly.", max_new_tokens=3)
    assert inputs["max_new_tokens"] == 3 and len(b) == 0


def test_sending_while_pending_raises_and_delivers_nothing(tiny):
    model, tokenizer = tiny
    a, b = _received(model, tokenizer)
    b.pop()
    got = []
    before = view(b)
    with pytest.raises(ValueError, match="agent.update"):
        transfer_sync([a, b], got.append, QUESTION)
    assert got == []
    assert_unchanged(b, before)


def test_continuation_can_be_sent_onward(tiny):
    model, tokenizer = tiny
    a, b = _continued(model, tokenizer)
    state = b.sender_state()
    transfer_sync(b, a, "Send it back.", ratio=4)
    inherited = state.inherited_positions
    expected = inherited + -(-(state.positions - inherited) // 4)
    assert a.inspect()["deliveries"][0]["retained_positions"] == [expected]


# ---------------------------------------------------------------------------------------
# append


@pytest.mark.parametrize("form", ["text", "ids"])
def test_append_keeps_received_rows_on_a_private_copy(tiny, form):
    model, tokenizer = tiny
    _, b = _continued(model, tokenizer)
    old = b.sender_state()
    old_rows, old_ids, old_cache = old.input_embeds.clone(), old.token_ids.clone(), cache_length(old.past_key_values)
    result = "<|im_start|>tool\nCedar: owner Alice<|im_end|>\n"
    new_ids = ids_of(tokenizer, result)
    messages_before = history(b.messages)
    with counted_forwards(model) as calls:
        anyio.run(b.append, result if form == "text" else new_ids)
    assert calls == [new_ids.shape[1]], "only the appended rows are forwarded"
    state = b.sender_state()
    assert state is not old
    assert torch.equal(state.input_embeds[: old.positions], old_rows)
    assert torch.equal(state.token_ids, torch.cat([old_ids, new_ids[0]]))
    assert state.inherited_positions == old.inherited_positions and state.latent_steps == 0
    assert same_cache(state.past_key_values, prefill(model, state.input_embeds))
    assert cache_length(old.past_key_values) == old_cache and torch.equal(old.token_ids, old_ids)
    assert b.messages == messages_before, "append leaves the chat history alone"


def test_append_to_history_switches_to_retained(tiny):
    model, tokenizer = tiny
    messages = history(HISTORY_A)
    agent = rclc.bind(model, tokenizer, messages=messages)
    anyio.run(agent.append, "<|im_start|>tool\nok<|im_end|>\n")
    report = agent.inspect()
    assert report["state_source"] == "retained"
    rendered = render_messages(tokenizer, messages, generation_prompt=False)
    assert torch.equal(agent.sender_state().token_ids[: rendered.shape[1]], rendered[0])
    # After append, further history edits do not change the retained state.
    messages.append({"role": "user", "content": "ignored"})
    assert agent.sender_state().positions == report["cached_positions"]


def test_append_failures_keep_the_previous_state(tiny):
    model, tokenizer = tiny
    _, b = _continued(model, tokenizer)
    limit_gap = b.context_limit - b.sender_state().positions
    for prompt, match in [
        ([{"role": "tool", "content": "x"}], "chat messages"),
        ("", "empty"),
        (torch.tensor([[1, 2]], dtype=torch.int32), "int64"),
        (torch.tensor([[10**6]]), r"\[0,"),
        (torch.zeros(1, limit_gap + 1, dtype=torch.int64), "context limit"),
        (3, "prompt"),
    ]:
        before = view(b)
        with pytest.raises(ValueError, match=match):
            anyio.run(b.append, prompt)
        assert_unchanged(b, before)
    bare = rclc.bind(model, None, prompt=ids_of(tokenizer, DOC))
    before = view(bare)
    with pytest.raises(ValueError, match="tokenizer"):
        anyio.run(bare.append, "text")
    assert_unchanged(bare, before)
    empty = rclc.bind(model, tokenizer)
    with pytest.raises(ValueError, match="no state"):
        anyio.run(empty.append, "text")
    _, pending = _received(model, tokenizer)
    pending.pop()
    before = view(pending)
    with pytest.raises(ValueError, match="pending"):
        anyio.run(pending.append, "text")
    assert_unchanged(pending, before)


def test_append_respects_the_agent_context_limit(tiny):
    model, tokenizer = tiny
    ids = ids_of(tokenizer, DOC)
    agent = rclc.bind(model, tokenizer, prompt=ids, context_limit=ids.shape[1] + 3)
    anyio.run(agent.append, ids[:, :3])
    before = view(agent)
    with pytest.raises(ValueError, match="context limit"):
        anyio.run(agent.append, ids[:, :1])
    assert_unchanged(agent, before)


# ---------------------------------------------------------------------------------------
# inputs()


def test_inputs_prepare_native_generation_from_the_state(tiny):
    model, tokenizer = tiny
    a, b = _continued(model, tokenizer)
    transfer_sync(a, b, "Queued for later.")
    state = b.sender_state()
    inputs = anyio.run(functools.partial(b.inputs, max_new_tokens=3))
    assert inputs["max_new_tokens"] == 3 and len(b) == 1, "inputs() consumes no queued handoff"
    assert torch.equal(inputs["inputs_embeds"][0], state.input_embeds)
    assert inputs["inputs_embeds"].data_ptr() != state.input_embeds.data_ptr(), "rows are cloned"
    assert b.inspect()["pending_generation"]
    with pytest.raises(ValueError, match="pending"):
        anyio.run(b.inputs)
    output = generate(model, tokenizer, inputs)
    b.update(inputs=inputs, generation=output)
    after = b.sender_state()
    assert torch.equal(after.token_ids, torch.cat([state.token_ids, output.sequences[0]]))
    assert after.inherited_positions == state.inherited_positions
    assert anyio.run(b.inputs)["max_new_tokens"] == 6, "the agent's setting is the default"


def test_inputs_from_history_and_its_errors(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    total = render_messages(tokenizer, HISTORY_A, generation_prompt=False).shape[1]
    before = view(agent)
    with pytest.raises(ValueError, match="context space"):
        anyio.run(functools.partial(agent.inputs, max_new_tokens=agent.context_limit - total + 1))
    assert_unchanged(agent, before)
    with pytest.raises(ValueError, match="max_new_tokens"):
        anyio.run(functools.partial(agent.inputs, max_new_tokens=0))
    assert_unchanged(agent, before)
    inputs = anyio.run(functools.partial(agent.inputs, max_new_tokens=agent.context_limit - total))
    assert inputs["inputs_embeds"].shape[1] == total
    assert torch.equal(agent._pending.known_ids, render_messages(tokenizer, HISTORY_A, generation_prompt=False)[0])


# ---------------------------------------------------------------------------------------
# Cancellation


def _cancel_midway(model, call):
    """Start `call`, cancel it once a (slowed) forward has begun; return what the caller saw."""
    observed = {}

    async def runner():
        try:
            await call()
        except anyio.get_cancelled_exc_class():
            observed["cancelled"] = True
            raise
        observed["finished"] = True

    async def main():
        cancelled = threading.Event()
        with counted_forwards(model, held_until=cancelled) as calls:  # the operation cannot end first
            async with anyio.create_task_group() as group:
                group.start_soon(runner)
                while not calls:
                    await anyio.sleep(0.001)
                observed["forwards_at_cancel"] = len(calls)
                group.cancel_scope.cancel()
                cancelled.set()
            observed["forwards"] = len(calls)

    anyio.run(main)
    return observed


def test_cancelled_append_keeps_the_previous_state(tiny):
    model, tokenizer = tiny
    _, b = _continued(model, tokenizer)
    before = view(b)
    observed = _cancel_midway(model, functools.partial(b.append, "<|im_start|>tool\nlate<|im_end|>\n"))
    assert observed.get("cancelled") and "finished" not in observed
    assert observed["forwards"] == 1
    assert_unchanged(b, before)
    anyio.run(b.append, "<|im_start|>tool\nlate<|im_end|>\n")
    assert b.sender_state() is not before.state


def test_cancelled_inputs_keep_the_previous_state(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    before = view(agent)
    observed = _cancel_midway(model, agent.inputs)
    assert observed.get("cancelled") and observed["forwards"] == 1
    assert_unchanged(agent, before)
    assert agent.inspect()["cached_positions"] == 0, "the cancelled prefill is not kept either"
    anyio.run(agent.inputs)
    assert agent.inspect()["pending_generation"]


def test_cancelled_transfer_leaves_a_bound_receiver_empty(tiny):
    model, tokenizer = tiny
    a, b = _pair(model, tokenizer)
    started, release = threading.Event(), threading.Event()

    def slow(sender, request_ids, budget):
        started.set()
        release.wait(5)
        return list(range(budget))

    async def main():
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(transfer, a, b, QUESTION, selector=slow))
            await anyio.to_thread.run_sync(started.wait, 5)
            group.cancel_scope.cancel()
            threading.Timer(0.1, release.set).start()

    anyio.run(main)
    assert len(b) == 0 and not b.inspect()["pending_generation"]
    transfer_sync(a, b, QUESTION)
    assert len(b) == 1


# ---------------------------------------------------------------------------------------
# Joining several handoffs, and absorbing without generating (used by the graph layer)


def test_pop_joins_several_deliveries(tiny):
    model, tokenizer = tiny
    a, b = _pair(model, tokenizer)
    transfer_sync(a, b, QUESTION)
    transfer_sync(a, b, "When did Birch launch?")
    first, second = b.peek(0)[0].positions, b.peek(1)
    inputs = b.pop(deliveries=2)
    assert len(b) == 0
    assert inputs["inputs_embeds"].shape[1] == first + second[0].positions + second[1].input_ids.shape[1]
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    assert b.sender_state().inherited_positions == first + second[0].positions


def test_absorb_makes_received_rows_and_prompt_the_state(tiny):
    model, tokenizer = tiny
    a, b = _received(model, tokenizer, requests=[QUESTION, "Second?"])
    delivery, prepared = b.peek(0)
    with counted_forwards(model) as calls:
        anyio.run(b.absorb)
    state = b.sender_state()
    assert calls == [delivery.positions + prepared.input_ids.shape[1]], "one prefill, nothing generated"
    assert len(b) == 1 and not b.inspect()["pending_generation"]
    assert state.inherited_positions == delivery.positions
    sent_ids = torch.cat([message.source_ids for message in delivery.messages])
    assert torch.equal(state.token_ids, torch.cat([sent_ids, prepared.input_ids[0]]))
    assert same_cache(state.past_key_values, prefill(model, state.input_embeds))
    before = view(b)
    with pytest.raises(ValueError, match="context space"):
        anyio.run(functools.partial(b.absorb, prompt=torch.zeros(1, b.context_limit, dtype=torch.int64)))
    assert_unchanged(b, before)
    b.pop()
    before = view(b)
    with pytest.raises(ValueError, match="pending"):
        anyio.run(b.absorb)
    assert_unchanged(b, before)
