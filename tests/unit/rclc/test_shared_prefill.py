"""Shared prompt prefixes and batched prompt prefills (issue 28): the prefix store finds what
it should, a prompt over a stored prefix forwards only its rest, prompts waiting together
share one forward, every result matches one prefill of the prompt alone (bit for bit on
the tiny models where the arithmetic allows, else to float32 rounding), and turning both
off prefills exactly as before."""

from __future__ import annotations

import threading

import anyio
import pytest
import torch

import rclc
from tests.helpers.agents import counted_forwards, prompts_alone
from tests.helpers.combining import queued_together, wait_for
from rclc import sender_from_hf, testing
from rclc._cache import cache_layers, prefill
from rclc._prefix_cache import MIN_SHARED, PrefixCache
from rclc._shared_prefill import shared_prefill
from rclc.backends.hf_batching import engine_for
from rclc.errors import RclcError

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(params=["qwen3", "llama"])
def fresh(request, tiny_tokenizer):
    """A tiny model no other test has prefilled anything on (its prefix store is empty)."""
    model, tokenizer = testing.tiny_model(request.param, tokenizer=tiny_tokenizer, seed=11)
    return model, tokenizer


def prompts(count, shared=40, own=12, seed=0):
    """`count` token prompts `[1, n]` sharing their first `shared` IDs."""
    generator = torch.Generator().manual_seed(seed)
    head = torch.randint(5, 200, (shared,), generator=generator)
    return [torch.cat([head, torch.randint(5, 200, (own + index,), generator=generator)]).unsqueeze(0)
            for index in range(count)]


def layers_of(state):
    return cache_layers(state.past_key_values)


def assert_close_layers(found, expected, exact=False):
    for (keys, values), (keys2, values2) in zip(found, expected):
        if exact:
            assert torch.equal(keys, keys2) and torch.equal(values, values2)
        else:
            torch.testing.assert_close(keys, keys2, **TOLERANCE)
            torch.testing.assert_close(values, values2, **TOLERANCE)


def alone(model, ids):
    return cache_layers(prefill(model, model.get_input_embeddings().weight[ids[0]]))


# -- the store ------------------------------------------------------------------------


def fake_layers(length, layers=2):
    return [(torch.full((1, 1, length, 2), float(i)), torch.full((1, 1, length, 2), -float(i))) for i in range(layers)]


def test_the_store_finds_the_longest_shared_prefix_and_never_a_whole_prompt():
    store = PrefixCache(1 << 20)
    first = torch.arange(40)
    store.add(first, fake_layers(40))
    assert store.longest(torch.arange(10)) is None  # shorter than MIN_SHARED
    other = torch.cat([torch.arange(30), torch.tensor([999, 998])])
    found = store.longest(other)
    assert found.length == 30 and found.layers[0][0].shape[2] == 30
    same = store.longest(torch.arange(40))
    assert same.length == 39  # the last position is always forwarded (its logits, its own KV)
    assert store.longest(torch.cat([torch.tensor([7]), torch.arange(40)])) is None  # a prefix, not a substring
    assert store.report()["hits"] == 2 and store.report()["misses"] == 2


def test_the_store_keeps_one_entry_per_prompt_it_extends_and_stays_within_its_budget():
    store = PrefixCache(1 << 20)
    store.add(torch.arange(30), fake_layers(30))
    store.add(torch.arange(40), fake_layers(40))  # extends the first: it replaces it
    store.add(torch.arange(35), fake_layers(35))  # already covered by the second: not stored
    assert store.report()["entries"] == 1
    size = store.report()["bytes"]
    store.add(torch.arange(100, 140), fake_layers(40))
    assert store.report()["entries"] == 2
    store.resize(size)  # room for one: the least recently used goes
    assert store.report()["entries"] == 1 and store.longest(torch.arange(100, 140)) is not None
    store.resize(0)
    assert store.report()["entries"] == 0
    store.add(torch.arange(MIN_SHARED), fake_layers(MIN_SHARED))  # too short to ever be reused
    assert store.report()["entries"] == 0


# -- worker-side prompt prefills (readers' prompts, histories) --------------------------


def test_a_prompt_over_a_stored_prefix_forwards_only_its_rest_and_matches_one_prefill(fresh):
    model, tokenizer = fresh
    first, second = prompts(2)
    sender_from_hf(model, tokenizer, first)
    with counted_forwards(model) as calls:
        state = sender_from_hf(model, tokenizer, second)
    assert calls == [second.shape[1] - 40]  # the 40 shared IDs came from the store
    assert_close_layers(layers_of(state), alone(model, second))
    report = rclc.batching_report(model)["prompt_prefills"]
    assert report["reused_positions"] == 40 and report["prefix_cache"]["entries"] == 2


def test_prompts_alone_are_prefilled_bit_for_bit_as_before(fresh):
    model, tokenizer = fresh
    first, second = prompts(2)
    sender_from_hf(model, tokenizer, first)  # leaves its prefix in the store
    with prompts_alone(model):
        assert rclc.batching_report(model)["prompt_prefills"]["prefix_cache"]["entries"] == 0  # emptied
        with counted_forwards(model) as calls:
            state = sender_from_hf(model, tokenizer, second)
    assert calls == [second.shape[1]]
    assert_close_layers(layers_of(state), alone(model, second), exact=True)


def together(model, tokenizer, batch):
    """Prefill `batch` from one thread each, all queued before any prefill runs; returns each
    state or error, and the forwards that ran."""
    jobs = [lambda ids=ids: sender_from_hf(model, tokenizer, ids) for ids in batch]
    with counted_forwards(model) as calls:
        results = queued_together(model, shared_prefill(model), jobs)
    return results, calls


def test_prompts_waiting_together_are_prefilled_in_one_forward(fresh):
    model, tokenizer = fresh
    batch = prompts(3, seed=1)
    with prompts_alone(model):
        references = [alone(model, ids) for ids in batch]
    results, calls = together(model, tokenizer, batch)
    assert len(calls) == 1  # one forward of the three (nothing stored yet: from position 0)
    for state, reference in zip(results, references):
        assert_close_layers(layers_of(state), reference)
    report = rclc.batching_report(model)["prompt_prefills"]
    assert report["batch_sizes"] == {"3": 1}
    assert report["padding_positions"] == 2 + 1  # 52, 53 and 54 tokens, right-padded to 54
    # Three more prompts with the same head: one forward of their rest over the stored prefix.
    again, calls = together(model, tokenizer, prompts(3, seed=1, own=20))
    assert calls == [max(ids.shape[1] for ids in prompts(3, seed=1, own=20)) - 40]
    for state, ids in zip(again, prompts(3, seed=1, own=20)):
        assert_close_layers(layers_of(state), alone(model, ids))
    assert rclc.batching_report(model)["prompt_prefills"]["padding_positions"] == 3 + 3


def test_a_failing_prompt_in_a_batch_fails_alone(fresh):
    model, tokenizer = fresh
    batch = prompts(3, seed=2)
    bad = batch[1]
    poison = model.get_input_embeddings().weight[bad[0, -1]]

    def refuse(module, args, kwargs):  # any forward holding the bad prompt's last token fails
        rows = kwargs.get("inputs_embeds")
        ids = kwargs.get("input_ids")
        if ids is not None and bool((ids == bad[0, -1]).any()):
            raise RuntimeError("bad prompt")
        if rows is not None and bool((rows == poison).all(-1).any()):
            raise RuntimeError("bad prompt")

    handle = rclc._cache.backbone(model).register_forward_pre_hook(refuse, with_kwargs=True)
    try:
        results, _ = together(model, tokenizer, batch)
    finally:
        handle.remove()
    assert isinstance(results[1], RuntimeError)
    for index in (0, 2):
        assert_close_layers(layers_of(results[index]), alone(model, batch[index]))


# -- generation prompts (the batching engine's prefill thread) --------------------------


def generate(model, tokenizer, prompt, tokens=6):
    return anyio.run(lambda: rclc.bind(model, tokenizer).generate(prompt, max_new_tokens=tokens))


def test_a_generation_prompt_over_a_stored_prefix_picks_the_tokens_it_picks_alone(fresh):
    model, tokenizer = fresh
    first, second = prompts(2, seed=3)
    with prompts_alone(model):
        expected = generate(model, tokenizer, second).token_ids
    generate(model, tokenizer, first)
    with counted_forwards(model) as calls:
        found = generate(model, tokenizer, second).token_ids
    assert calls[0] == second.shape[1] - 40  # the prefill forwarded the rest only
    assert found == expected


def generate_together(model, tokenizer, batch):
    """Generate `batch` (four prompts) at once; the first one's prefill holds the prefill
    thread until the other three wait, so they are prefilled together. Returns the token IDs
    and the rows of every backbone forward."""
    engine = engine_for(model)
    entered, release = threading.Event(), threading.Event()

    def hold_the_first(module, args, kwargs):
        if not release.is_set():
            entered.set()
            wait_for(lambda: len(engine._pending) == len(batch) - 1)
            release.set()

    results = [None] * len(batch)
    handle = rclc._cache.backbone(model).register_forward_pre_hook(hold_the_first, with_kwargs=True)
    try:
        with counted_forwards(model) as calls:
            async def main():
                async with anyio.create_task_group() as group:
                    for index, ids in enumerate(batch):
                        async def one(index=index, ids=ids):
                            results[index] = await rclc.bind(model, tokenizer).generate(ids, max_new_tokens=6)
                        group.start_soon(one)
                        if index == 0:  # the first is prefilling before the others arrive
                            await anyio.to_thread.run_sync(entered.wait)

            anyio.run(main)
    finally:
        handle.remove()
    return [result.token_ids for result in results], calls


def test_generations_waiting_together_are_prefilled_in_one_forward(fresh):
    model, tokenizer = fresh
    batch = prompts(4, shared=4, seed=4)  # nothing to share: all from position 0
    with prompts_alone(model):
        expected = [generate(model, tokenizer, ids).token_ids for ids in batch]
    found, _ = generate_together(model, tokenizer, batch)
    assert engine_for(model).report()["prefill_batches"] == {"3": 1}
    assert found == expected
    # Token prompts sharing a stored head: the three waiting ones are forwarded together,
    # over the head the store holds (the forward's rows are their longest rest).
    batch = prompts(4, shared=40, seed=5)
    with prompts_alone(model):
        expected = [generate(model, tokenizer, ids).token_ids for ids in batch]
    generate(model, tokenizer, prompts(1, shared=40, seed=5, own=30)[0])  # leaves the head in the store
    found, calls = generate_together(model, tokenizer, batch)
    assert engine_for(model).report()["prefill_batches"] == {"3": 2}
    assert max(ids.shape[1] for ids in batch[1:]) - 40 in calls
    assert found == expected


# -- options ----------------------------------------------------------------------------


def test_prompt_options_are_checked_and_reported(fresh):
    model, _ = fresh
    with pytest.raises(RclcError, match="prefill_batch"):
        rclc.Batching(prefill_batch=0)
    with pytest.raises(RclcError, match="prefix_cache_mib"):
        rclc.Batching(prefix_cache_mib=-1)
    with pytest.raises(RclcError, match="shared_prefixes"):
        rclc.Batching(shared_prefixes="yes")
    options = rclc.configure_batching(model, prefill_batch=3, prefix_cache_mib=1)
    try:
        report = rclc.batching_report(model)
        assert report["prefill_batch"] == 3 and report["prefix_cache_mib"] == 1
        assert report["prompt_prefills"]["prefix_cache"]["max_bytes"] == 1 << 20
        assert options.to_dict()["shared_prefixes"] is True
    finally:
        rclc.configure_batching(model, rclc.Batching())


def test_a_cancelled_slot_holder_still_serves_the_prompts_waiting_on_it(fresh):
    # The thread that takes the slot first serves every waiting prompt; its own caller being
    # cancelled must not stop the others' prefills (they wait on it), only drop its own.
    from rclc import _worker

    model, tokenizer = fresh
    first, second = prompts(2, seed=6)
    prefills = shared_prefill(model)
    cancelled = threading.Event()
    cancelled.set()
    results = dict(zip(("cancelled", "waiting"), queued_together(
        model, prefills, [lambda: prefills.prefill(model, first[0]), lambda: prefills.prefill(model, second[0])],
        stops=[cancelled, None],
    )))
    assert isinstance(results["cancelled"], _worker.WorkCancelled)
    assert_close_layers(cache_layers(results["waiting"]), alone(model, second))
