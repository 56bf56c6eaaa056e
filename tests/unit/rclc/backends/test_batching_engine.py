"""The HF batching engine (issue 14): batched decode equals unbatched decode up to float32
rounding, sequences of different lengths join and leave mid-batch, one sequence's
cancellation, stop or failure leaves the others alone, and greedy generation picks exactly
what `model.generate` picks."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
import torch
from transformers import DynamicCache, GenerationConfig

import rclc
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone
from rclc.backends import hf_batching
from rclc.backends.batch_cache import BatchCache
from rclc.backends.batch_cache import decode_step, prefill
from rclc.backends.hf_batching import engine_for

from tests.helpers.agents import prompts_alone
from tests.helpers.batching import PROMPTS, assert_equal_or_near_tie, concurrently, decode_rows_of, generate_alone



def embeds(model, tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model.get_input_embeddings()(ids)


def unbatched_logits(model, rows, tokens):
    """Logits of forwarding `tokens` one by one after `rows`, alone, with a plain DynamicCache."""
    cache = DynamicCache(config=model.config)
    length = rows.shape[1]
    with torch.no_grad():
        out = model(inputs_embeds=rows, attention_mask=torch.ones(1, length, dtype=torch.long), cache=cache,
                    use_cache=True)
        found = [out.logits[0, -1].float()]
        for token in tokens:
            out = model(input_ids=torch.tensor([[token]]), attention_mask=torch.ones(1, length + 1, dtype=torch.long),
                        position_ids=torch.tensor([[length]]), cache=cache, use_cache=True)
            length += 1
            found.append(out.logits[0, -1].float())
    return found


def test_batched_logits_match_unbatched_within_float32_tolerance_as_sequences_join_and_leave(tiny):
    """Four prompts of different lengths; they join at steps 0, 0, 2 and 4 (the last is the
    longest, so the window widens to the left) and leave after 3, 8, 6 and 5 tokens."""
    model, tokenizer = tiny
    rows = [embeds(model, tokenizer, text) for text in PROMPTS]
    generator = torch.Generator().manual_seed(0)
    forced = [torch.randint(0, model.config.vocab_size, (8,), generator=generator).tolist() for _ in PROMPTS]
    lengths = {0: 3, 1: 8, 2: 6, 3: 5}
    joins = {0: [0, 1], 2: [2], 4: [3]}
    reference = {i: unbatched_logits(model, rows[i], forced[i][: lengths[i]]) for i in range(len(PROMPTS))}
    store = BatchCache(model.config.num_hidden_layers)
    rows_of: list[int] = []  # batch row -> prompt index
    got: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(PROMPTS))}
    sizes = []
    with torch.no_grad():
        for step in range(12):
            for index in joins.get(step, []):
                logits, layers = prefill(model, None, rows[index])
                got[index].append(logits)
                store.join(layers, right_room=8, row_capacity=4)
                rows_of.append(index)
            if not rows_of:
                break
            tokens = [forced[index][len(got[index]) - 1] for index in rows_of]
            logits = decode_step(model, store, tokens)
            sizes.append(len(rows_of))
            for row, index in enumerate(rows_of):
                got[index].append(logits[row])
            for row in reversed(range(len(rows_of))):
                index = rows_of[row]
                if len(got[index]) == lengths[index] + 1:
                    kept = store.extract(row)
                    assert kept[0][0].shape[2] == rows[index].shape[1] + lengths[index]  # prompt + forwarded tokens
                    moved = store.remove(row)
                    if moved is not None:
                        rows_of[row] = rows_of[moved]
                    rows_of.pop()
    assert max(sizes) == 3 and min(sizes) == 1  # several at once, and alone at the end
    for index in range(len(PROMPTS)):
        assert len(got[index]) == lengths[index] + 1
        for batched, alone in zip(got[index], reference[index]):
            torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)
    assert store.rows == 0 and store.keys == []  # an empty batch holds no KV memory


def test_a_row_leaving_keeps_the_others_padding_zero(tiny):
    model, tokenizer = tiny
    store = BatchCache(model.config.num_hidden_layers)
    with torch.no_grad():
        for text in PROMPTS[:3]:
            _, layers = prefill(model, None, embeds(model, tokenizer, text))
            store.join(layers, right_room=4, row_capacity=3)
        store.remove(1)  # the longest leaves: the window shrinks to the longest left
    assert store.width == max(store.lengths)
    for keys, values in zip(store.keys, store.values):
        for row, length in enumerate(store.lengths):
            pad = store.width - length
            assert torch.count_nonzero(keys[row, :, store.start : store.start + pad]) == 0
            assert torch.count_nonzero(values[row, :, store.start : store.start + pad]) == 0


def test_greedy_generation_picks_what_model_generate_picks(tiny):
    model, tokenizer = tiny
    ids = tokenizer(PROMPTS[1], add_special_tokens=False, return_tensors="pt")["input_ids"]
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True)
    expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    result = generate_alone(model, tokenizer, PROMPTS[1], max_new_tokens=12)
    assert list(result.token_ids) == expected.sequences[0, ids.shape[1]:].tolist()


def test_the_checkpoints_logits_processors_apply_as_in_generate(tiny_tokenizer):
    """A repetition penalty in the checkpoint's generation config changes greedy decoding;
    the engine applies it exactly as `model.generate` does (processors built by transformers)."""
    model, tokenizer = rclc.testing.tiny_model("llama", tokenizer=tiny_tokenizer, seed=3)
    model.generation_config.repetition_penalty = 5.0
    plain = rclc.testing.tiny_model("llama", tokenizer=tiny_tokenizer, seed=3)[0]
    ids = tokenizer(PROMPTS[0], add_special_tokens=False, return_tensors="pt")["input_ids"]
    config = GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True)
    expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    penalised = generate_alone(model, tokenizer, PROMPTS[0], max_new_tokens=16)
    unpenalised = generate_alone(plain, tokenizer, PROMPTS[0], max_new_tokens=16)
    assert list(penalised.token_ids) == expected.sequences[0, ids.shape[1]:].tolist()
    assert penalised.token_ids != unpenalised.token_ids  # the penalty really did something


def test_concurrent_generations_of_different_lengths_equal_their_unbatched_runs(tiny):
    model, tokenizer = tiny
    engine = engine_for(model)
    before = engine.report()["batch_sizes"]
    options = [{"max_new_tokens": n} for n in (3, 11, 7, 16)]
    with engine.tracing() as trace:
        alone = [generate_alone(model, tokenizer, prompt, **option) for prompt, option in zip(PROMPTS, options)]
        ended_before = engine.report()["sequences"]

        def decode_once_all_are_in(module, args):
            # a decode step waits until every generation is in the batch: they share steps on
            # any machine, not only when their prefills happen to finish close together
            if threading.current_thread().name != "rclc-batching-decode":
                return
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                report = engine.report()
                if report["waiting"] == 0 and report["active"] + report["sequences"] - ended_before >= len(PROMPTS):
                    return
                time.sleep(0.005)

        handle = backbone(model).register_forward_pre_hook(decode_once_all_are_in)
        try:
            batched = concurrently([rclc.bind(model, tokenizer) for _ in PROMPTS], PROMPTS, options)
        finally:
            handle.remove()
    for together, single in zip(batched, alone):
        assert_equal_or_near_tie(list(together.token_ids), list(single.token_ids), trace)
    after = engine.report()["batch_sizes"]
    assert any(int(size) > 1 and after[size] > before.get(size, 0) for size in after)


def test_sampled_generations_do_not_depend_on_their_batch_company(tiny):
    model, tokenizer = tiny
    sampling = [rclc.Sampling(temperature=0.9, top_p=0.95, seed=seed) for seed in (1, 2, 3)]
    options = [{"max_new_tokens": 10, "sampling": s} for s in sampling]
    alone = [generate_alone(model, tokenizer, PROMPTS[i], **options[i]) for i in range(3)]
    again = [generate_alone(model, tokenizer, PROMPTS[i], **options[i]) for i in range(3)]
    batched = concurrently([rclc.bind(model, tokenizer) for _ in range(3)], PROMPTS[:3], options)
    assert [r.token_ids for r in alone] == [r.token_ids for r in again]  # seeded: reproducible
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    state = torch.random.get_rng_state()
    generate_alone(model, tokenizer, PROMPTS[0], **options[0])
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is never drawn from


def slow_steps(model, seconds=0.01):
    def wait(module, args):
        threading.Event().wait(seconds)  # a pre-hook must return None, or it replaces the arguments

    return backbone(model).register_forward_pre_hook(wait)


def test_cancelling_one_generation_stops_it_at_the_next_step_and_leaves_the_others(tiny):
    model, tokenizer = tiny
    engine = engine_for(model)
    with engine.tracing() as trace:
        alone = [generate_alone(model, tokenizer, PROMPTS[i], max_new_tokens=40) for i in (0, 2)]
    agents = [rclc.bind(model, tokenizer) for _ in range(3)]
    results = [None] * 3
    tokens_of_cancelled = []
    first_token = threading.Event()

    def on_token(index, text):
        tokens_of_cancelled.append(index)
        first_token.set()

    async def main():
        async with anyio.create_task_group() as group:
            async def keep(index, prompt):
                results[index] = await agents[index].generate(prompt, max_new_tokens=40)

            group.start_soon(keep, 0, PROMPTS[0])
            group.start_soon(keep, 2, PROMPTS[2])
            with anyio.CancelScope() as scope:
                async def cancel_once_generating():
                    # once it has a token, not after a fixed delay: on a loaded machine its
                    # prefill alone can outlast any delay chosen here
                    await anyio.to_thread.run_sync(first_token.wait, 60)
                    scope.cancel()

                group.start_soon(cancel_once_generating)
                await agents[1].generate(PROMPTS[1], max_new_tokens=1500, on_token=on_token)

    handle = slow_steps(model)
    try:
        with decode_rows_of(model, lambda sequence: sequence.gone()) as late_rows:  # a cancelled caller's
            anyio.run(main)
    finally:
        handle.remove()
    assert first_token.is_set() and 0 < len(tokens_of_cancelled) < 1500
    assert agents[1].inspect()["state_source"] == "messages"  # nothing recorded for the cancelled one
    # once its caller's cancellation reaches it, the sequence is in at most the step under way
    assert len(late_rows) <= 1
    for together, single in zip((results[0], results[2]), alone):  # which steps they shared depends on timing
        assert_equal_or_near_tie(list(together.token_ids), list(single.token_ids), trace)
    assert engine.report()["active"] == 0


def test_a_stop_event_ends_only_its_own_sequence(tiny):
    model, tokenizer = tiny
    stop = threading.Event()

    def on_token(index, text):
        if index == 4:
            stop.set()

    engine = engine_for(model)
    with engine.tracing() as trace:
        full = generate_alone(model, tokenizer, PROMPTS[2], max_new_tokens=30)
    options = [{"max_new_tokens": 200, "on_token": on_token, "stop": stop}, {"max_new_tokens": 30}]
    handle = slow_steps(model, 0.005)
    try:
        # the stopped sequence's rows in decode steps begun once its event was set
        with decode_rows_of(model, lambda sequence: sequence.stop is stop and stop.is_set()) as late_rows:
            stopped, other = concurrently([rclc.bind(model, tokenizer) for _ in range(2)], [PROMPTS[1], PROMPTS[2]],
                                          options)
    finally:
        handle.remove()
    # on_token runs in the waiting thread, behind the engine on a loaded machine, so the count
    # at the stop varies; once the event is set at most the step under way completes
    assert stopped.stopped and 5 <= stopped.tokens < 200 and len(late_rows) <= 1
    assert not other.stopped
    assert_equal_or_near_tie(list(other.token_ids), list(full.token_ids), trace)


def test_a_failing_generation_fails_alone(tiny):
    """A sequence whose token consumer raises, and one whose prefill raises, fail; the
    sequences batched with them finish with their unbatched tokens."""
    model, tokenizer = tiny
    alone = generate_alone(model, tokenizer, PROMPTS[0], max_new_tokens=20)
    failing_prompt = tokenizer(PROMPTS[3], add_special_tokens=False, return_tensors="pt")["input_ids"]
    decoder = backbone(model)

    def raise_for_the_failing_prompt(module, args, kwargs):
        rows = kwargs.get("inputs_embeds")
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] == failing_prompt.shape[1] and torch.equal(ids, failing_prompt):
            raise RuntimeError("prefill fault injected")
        return None

    def broken_consumer(index, text):
        if index == 2:
            raise KeyError("consumer fault injected")

    handle = decoder.register_forward_pre_hook(raise_for_the_failing_prompt, with_kwargs=True)
    try:
        options = [{"max_new_tokens": 20}, {"max_new_tokens": 50, "on_token": broken_consumer}, {"max_new_tokens": 20}]
        agents = [rclc.bind(model, tokenizer) for _ in range(3)]
        with prompts_alone(model):  # the whole failing prompt is forwarded (no stored prefix of it)
            healthy, consumer, prefill_failure = concurrently(agents, [PROMPTS[0], PROMPTS[1], failing_prompt], options)
    finally:
        handle.remove()
    assert isinstance(consumer, KeyError) and isinstance(prefill_failure, RuntimeError)
    assert "prefill fault injected" in str(prefill_failure)
    assert healthy.token_ids == alone.token_ids
    assert agents[1].inspect()["state_source"] == "messages" and agents[2].inspect()["state_source"] == "messages"
    assert engine_for(model).report()["active"] == 0


def test_tokens_reach_each_consumer_in_order_and_a_slow_one_holds_back_nobody(tiny):
    """Each sequence's tokens reach its own consumer, in order, from its own worker thread; a
    consumer that blocks delays its own generation only: the slow consumer waits, at its first
    token, until the other generation has finished (no clock: if the slow one held the other
    back, the wait would run out and say so)."""
    model, tokenizer = tiny
    slow, fast, threads = [], [], set()
    done = {}
    fast_finished = threading.Event()
    waits = []

    def slow_consumer(index, text):
        threads.add(threading.current_thread().name)
        if index == 0:
            waits.append(fast_finished.wait(timeout=300))
        slow.append(index)

    async def main():
        agents = [rclc.bind(model, tokenizer) for _ in range(2)]
        async with anyio.create_task_group() as group:
            async def one(name, agent, prompt, on_token):
                done[name] = await agent.generate(prompt, max_new_tokens=12, on_token=on_token)
                if name == "fast":
                    fast_finished.set()

            group.start_soon(one, "slow", agents[0], PROMPTS[0], slow_consumer)
            group.start_soon(one, "fast", agents[1], PROMPTS[1], lambda i, t: fast.append(i))

    anyio.run(main)
    assert slow == list(range(done["slow"].tokens)) and fast == list(range(done["fast"].tokens))
    assert not any(name.startswith("rclc-batching") for name in threads)  # from the caller's worker thread
    assert waits == [True], "the fast generation did not finish while the slow consumer held its first token"


def test_batching_off_decodes_one_at_a_time_with_the_same_tokens(tiny_tokenizer):
    model, tokenizer = rclc.testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, seed=5)
    on = [generate_alone(model, tokenizer, prompt, max_new_tokens=6) for prompt in PROMPTS]
    assert rclc.configure_batching(model, enabled=False).batch_limit == 1
    engine_before = dict(rclc.batching_report(model)["batch_sizes"])
    off = concurrently([rclc.bind(model, tokenizer) for _ in PROMPTS], PROMPTS, [{"max_new_tokens": 6}] * 4)
    report = rclc.batching_report(model)
    assert set(report["batch_sizes"]) == {"1"} and report["enabled"] is False
    assert report["batch_sizes"]["1"] > engine_before.get("1", 0)
    assert [r.token_ids for r in off] == [r.token_ids for r in on]
    assert rclc.configure_batching(model, rclc.Batching(max_batch=2, wait_ms=0)).max_batch == 2
    concurrently([rclc.bind(model, tokenizer) for _ in PROMPTS], PROMPTS, [{"max_new_tokens": 6}] * 4)
    assert max(int(size) for size in rclc.batching_report(model)["batch_sizes"]) == 2


def test_batching_options_are_checked():
    with pytest.raises(rclc.RclcError, match="max_batch"):
        rclc.Batching(max_batch=0)
    with pytest.raises(rclc.RclcError, match="wait_ms"):
        rclc.Batching(wait_ms=-1)
    with pytest.raises(rclc.RclcError, match="enabled"):
        rclc.Batching(enabled="yes")
    with pytest.raises(rclc.RclcError, match="model"):
        rclc.configure_batching(object())
    with pytest.raises(rclc.RclcError, match="not a batching option"):
        rclc.configure_batching(rclc.testing.tiny_model("llama")[0], batch=3)


def test_the_engine_threads_end_when_no_work_is_left(tiny):
    model, tokenizer = tiny
    generate_alone(model, tokenizer, PROMPTS[0], max_new_tokens=3)
    engine = engine_for(model)
    engine.settle()
    assert not engine.report()["running"]
    threads = [thread for thread in engine._threads.values() if thread is not None]
    assert threads and not any(thread.is_alive() for thread in threads)
    assert hf_batching.existing_engine(model) is engine


def test_the_buffer_reserves_room_for_at_most_64_more_tokens(tiny):
    """A sequence allowed 5000 new tokens does not make the batch hold 5000 empty columns."""
    from rclc.backends.batch_cache import ROOM_STEP

    model, tokenizer = tiny
    store = BatchCache(model.config.num_hidden_layers)
    with torch.no_grad():
        _, layers = prefill(model, None, embeds(model, tokenizer, PROMPTS[1]))
        store.join(layers, right_room=5000, row_capacity=4)
        assert store.keys[0].shape[2] == store.width + ROOM_STEP
        for _ in range(ROOM_STEP + 3):  # past the reserved room: grow adds another step's worth
            decode_step(model, store, [1], right_room=5000)
    assert store.width == layers[0][0].shape[2] + ROOM_STEP + 3
    assert store.keys[0].shape[2] <= store.width + ROOM_STEP
