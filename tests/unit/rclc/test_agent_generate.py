"""Agent.generate: native generation in one call, on tiny Qwen3 and Llama.

It must do exactly what a user loop does by hand (pop -> model.generate -> update) and what
the graph layer does today (seeded, forked RNG; the model's EOS; the tokenizer's padding),
report tokens in order from the worker thread, stop at the next step, and leave the agent
untouched on any failure or cancellation.
"""

from __future__ import annotations

import functools
import threading

import anyio
import pytest
import torch
from transformers import GenerationConfig

import rclc
from rclc import Sampling, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone, cache_layers, prefill
from tests.helpers.agents import (
    HISTORY_A,
    HISTORY_B,
    QUESTION,
    assert_unchanged,
    counted_forwards,
    generate,
    history,
    ids_of,
    same_cache,
    view,
)
from tests.helpers.batching import decode_rows_of

PROMPT = "<|im_start|>user\nWho owns Cedar?<|im_end|>\n<|im_start|>assistant\n"


def _receiver(model, tokenizer, *, requests=(QUESTION,), max_new_tokens=6):
    """Agent B with one queued handoff from A per request."""
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=max_new_tokens)
    transfer_sync(a, b, list(requests))
    return b


def _same_state(x, y, *, exact_cache=True):
    assert torch.equal(x.input_embeds, y.input_embeds)
    assert torch.equal(x.token_ids, y.token_ids)
    assert (x.inherited_positions, x.latent_steps) == (y.inherited_positions, y.latent_steps)
    if exact_cache:
        for (kx, vx), (ky, vy) in zip(cache_layers(x.past_key_values), cache_layers(y.past_key_values)):
            assert torch.equal(kx, ky) and torch.equal(vx, vy)
    else:
        assert same_cache(x.past_key_values, y.past_key_values)


def _graph_generate(model, tokenizer, arguments, max_new_tokens, *, seed=0, temperature=None, top_p=None):
    """What rclc_graph's LocalExecutor._generate runs today (the behaviour phase 2 must keep)."""
    eos = model.generation_config.eos_token_id
    settings = {
        "max_new_tokens": max_new_tokens,
        "do_sample": temperature is not None,
        "eos_token_id": eos if eos is not None else tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "return_dict_in_generate": True,
    }
    if temperature is not None:
        settings["temperature"] = temperature
        if top_p is not None:
            settings["top_p"] = top_p
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model.generate(**arguments, generation_config=GenerationConfig(**settings))


# ---------------------------------------------------------------------------------------
# Same result as doing it by hand


def test_greedy_generate_equals_pop_generate_update(tiny):
    model, tokenizer = tiny
    by_hand, in_one_call = _receiver(model, tokenizer), _receiver(model, tokenizer)
    inputs = by_hand.pop()
    output = generate(model, tokenizer, inputs)
    by_hand.update(inputs=inputs, generation=output)

    result = anyio.run(in_one_call.generate)
    assert list(result.token_ids) == output.sequences[0].tolist()
    assert result.tokens == output.sequences.shape[1] >= 1
    assert result.text == tokenizer.decode(output.sequences[0], skip_special_tokens=True).strip()
    assert result.seconds > 0 and not result.stopped
    _same_state(in_one_call.sender_state(), by_hand.sender_state())
    assert len(in_one_call) == 0 and not in_one_call.inspect()["pending_generation"]
    assert in_one_call.inspect()["state_source"] == "retained"


def test_generate_from_a_prompt_alone_equals_update_with_the_generation(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=5)
    ids = ids_of(tokenizer, PROMPT)
    output = _graph_generate(model, tokenizer, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 5)
    reference = rclc.bind(model, tokenizer)
    reference.update(generation=output)

    result = anyio.run(agent.generate, PROMPT)
    assert list(result.token_ids) == output.sequences[0, ids.shape[1] :].tolist()
    _same_state(agent.sender_state(), reference.sender_state())
    assert agent.sender_state().inherited_positions == 0
    assert agent.inspect()["state_source"] == "retained"


def test_generate_takes_every_queued_handoff_unless_told(tiny):
    model, tokenizer = tiny
    questions = [QUESTION, "When did Birch launch?"]
    every, by_hand = _receiver(model, tokenizer, requests=questions), _receiver(model, tokenizer, requests=questions)
    inputs = by_hand.pop(deliveries=2)
    by_hand.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    anyio.run(every.generate)
    _same_state(every.sender_state(), by_hand.sender_state())

    first_only = _receiver(model, tokenizer, requests=questions)
    first = first_only.peek(0)[0].positions
    anyio.run(functools.partial(first_only.generate, deliveries=1))
    assert len(first_only) == 1 and first_only.sender_state().inherited_positions == first

    none_taken = _receiver(model, tokenizer, requests=questions)
    anyio.run(functools.partial(none_taken.generate, PROMPT, deliveries=0))
    assert len(none_taken) == 2 and none_taken.sender_state().inherited_positions == 0


def test_sampling_is_seeded_in_a_forked_rng(tiny):
    model, tokenizer = tiny
    sampling = Sampling(temperature=1.5, top_p=0.95, seed=7)
    ids = ids_of(tokenizer, PROMPT)
    output = _graph_generate(
        model, tokenizer, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 12, seed=7, temperature=1.5,
        top_p=0.95,
    )
    expected = output.sequences[0, ids.shape[1] :].tolist()
    outer = torch.random.get_rng_state()
    results = []
    for _ in range(2):
        agent = rclc.bind(model, tokenizer, max_new_tokens=12)
        results.append(anyio.run(functools.partial(agent.generate, PROMPT, sampling=sampling)))
    assert torch.equal(torch.random.get_rng_state(), outer), "the caller's RNG is untouched"
    assert [list(r.token_ids) for r in results] == [expected, expected]
    other = rclc.bind(model, tokenizer, max_new_tokens=12)
    reseeded = anyio.run(functools.partial(other.generate, PROMPT, sampling=Sampling(temperature=1.5, seed=8)))
    assert list(reseeded.token_ids) != expected, "a different seed samples differently (random tiny model)"


def test_sampling_settings_are_checked():
    with pytest.raises(rclc.RclcError, match="temperature"):
        Sampling(temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.5)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="seed"):
        Sampling(seed=-1)
    assert Sampling().greedy and not Sampling(temperature=0.7).greedy


# ---------------------------------------------------------------------------------------
# Token callbacks, stop, refresh


def test_tokens_are_reported_in_order_from_the_worker_thread(tiny):
    model, tokenizer = tiny
    for receiver in (_receiver(model, tokenizer), rclc.bind(model, tokenizer, max_new_tokens=6)):
        seen = []
        prompt = None if len(receiver) else PROMPT
        result = anyio.run(
            functools.partial(
                receiver.generate, prompt, on_token=lambda i, text: seen.append((i, text, threading.get_ident()))
            )
        )
        assert [i for i, _, _ in seen] == list(range(result.tokens))
        # issue 24 defect D2: the pieces are what the decoded text gains (rclc.backends.streamed_text),
        # not each token decoded alone: joined, they are the final text but for a character left unfinished
        streamed = "".join(text for _, text, _ in seen)
        final = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        assert final.startswith(streamed) and set(final[len(streamed):]) <= {"\ufffd"}
        assert all(thread != threading.get_ident() for _, _, thread in seen), "called from the worker thread"


def test_stop_ends_generation_after_the_current_step_and_records_it(tiny):
    model, tokenizer = tiny
    agent = _receiver(model, tokenizer, max_new_tokens=40)
    stop = threading.Event()
    delivered = agent.peek(0)[0].positions

    def on_token(index, text):
        if index == 1:
            stop.set()

    # Decode steps that began once the event was set (the batching engine's threads only;
    # recording the continuation afterwards forwards too).
    late_steps = []

    def count_late_step(module, args):
        if stop.is_set() and threading.current_thread().name.startswith("rclc-batching"):
            late_steps.append(1)

    handle = backbone(model).register_forward_pre_hook(count_late_step)
    try:
        result = anyio.run(functools.partial(agent.generate, on_token=on_token, stop=stop))
    finally:
        handle.remove()
    # The engine reads the event before reporting each token; tokens reach on_token from the waiting
    # thread while the engine decodes on, so how many were decoded before on_token(1) ran
    # depends on timing, but once the event is set at most the step under way completes.
    assert result.stopped and result.tokens >= 2 and len(late_steps) <= 1
    state = agent.sender_state()
    assert state.positions > delivered + result.tokens
    assert state.token_ids[-result.tokens :].tolist() == list(result.token_ids)
    assert len(agent) == 0


def test_refresh_rebuilds_the_cache_as_a_load_would(tiny):
    model, tokenizer = tiny
    plain, refreshed = _receiver(model, tokenizer), _receiver(model, tokenizer)
    anyio.run(plain.generate)
    anyio.run(functools.partial(refreshed.generate, refresh=True))
    state = refreshed.sender_state()
    _same_state(state, plain.sender_state(), exact_cache=False)
    fresh = prefill(model, state.input_embeds)
    for (k, v), (fk, fv) in zip(cache_layers(state.past_key_values), cache_layers(fresh)):
        assert torch.equal(k, fk) and torch.equal(v, fv)


# ---------------------------------------------------------------------------------------
# Failures and cancellation leave the agent as it was


def test_failures_keep_state_queue_and_pending(tiny):
    model, tokenizer = tiny
    agent = _receiver(model, tokenizer)
    before = view(agent)

    def broken(index, text):
        raise RuntimeError("observer broke")

    cases = [
        (functools.partial(agent.generate, on_token=broken), RuntimeError, "observer broke"),
        (functools.partial(agent.generate, deliveries=2), rclc.EmptyInboxError, "deliveries"),
        (functools.partial(agent.generate, sampling="greedy"), rclc.RclcError, "sampling"),
        (functools.partial(agent.generate, deliveries=0), rclc.RclcError, "prompt"),
        (functools.partial(agent.generate, max_new_tokens=4096), rclc.ContextLimitError, "context space"),
        (functools.partial(agent.generate, PROMPT, deliveries=0, max_new_tokens=4096), rclc.ContextLimitError,
         "context space"),
        (functools.partial(agent.generate, stop=True), rclc.RclcError, "stop"),
        (functools.partial(agent.generate, on_token="print"), rclc.RclcError, "on_token"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            anyio.run(call)
        assert_unchanged(agent, before)
    assert issubclass(rclc.EmptyInboxError, IndexError)

    agent.pop()
    pending = view(agent)
    with pytest.raises(rclc.AgentStateError, match="pending"):
        anyio.run(agent.generate)
    assert_unchanged(agent, pending)


def test_cancellation_stops_at_the_next_step_and_records_nothing(tiny):
    model, tokenizer = tiny
    agent = _receiver(model, tokenizer, max_new_tokens=60)
    before = view(agent)
    observed = {}
    second_token = threading.Event()

    def on_token(index, text):
        if index == 1:
            second_token.set()

    async def runner():
        try:
            await agent.generate(on_token=on_token)
        except anyio.get_cancelled_exc_class():
            observed["cancelled"] = True
            raise
        observed["finished"] = True

    async def main():
        with counted_forwards(model, delay=0.02) as calls:
            async with anyio.create_task_group() as group:
                group.start_soon(runner)
                await anyio.to_thread.run_sync(second_token.wait, 10)
                group.cancel_scope.cancel()
            observed["forwards"] = len(calls)

    with decode_rows_of(model, lambda sequence: sequence.gone()) as late_rows:  # a cancelled caller's
        anyio.run(main)
    assert observed.get("cancelled") and "finished" not in observed
    # how many steps ran while the cancellation travelled from the event loop to the engine
    # depends on the machine's load; once it arrived, at most the step under way completed
    assert len(late_rows) <= 1 and observed["forwards"] < 60
    assert_unchanged(agent, before)
    result = anyio.run(agent.generate)
    assert result.tokens >= 1 and len(agent) == 0
