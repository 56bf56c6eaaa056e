"""The HF batching engine puts prefills first (issue 28): a decode step waits, at most
`prefill_first_ms`, for prompts under or waiting for prefill to join its batch; prefills and
large decode steps run as two forwards side by side on a core no worker forward uses, and
either way each sequence gets the tokens it gets alone (or a float32 near-tie)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest
import torch

import rclc
# private on purpose: the engine's forwards, its slots and its threads are what is checked
from rclc import _locks
from rclc.backends import hf_batching
from rclc.backends.batch_cache import BatchCache, decode_step, prefill, prefill_many
from rclc.backends.hf_batching import _beside, engine_for

from tests.helpers.batching import PROMPTS, assert_equal_or_near_tie, concurrently, generate_alone

WAIT = 60.0  # seconds a test waits for an event that a working engine sets at once


@pytest.fixture
def options(tiny):
    """The tiny model's batching options, restored after the test (the model is shared)."""
    model, _ = tiny
    before = engine_for(model).batching
    yield lambda **changes: rclc.configure_batching(model, **changes)
    rclc.configure_batching(model, before)


def rows_of(model, tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model.get_input_embeddings()(ids)


def filled_store(model, tokenizer, prompts):
    store = BatchCache(model.config.num_hidden_layers)
    with torch.no_grad():
        for text in prompts:
            _, layers = prefill(model, None, rows_of(model, tokenizer, text))
            store.join(layers, right_room=4, row_capacity=len(prompts))
    return store


def test_a_step_as_two_halves_side_by_side_equals_one_forward_of_every_row(tiny):
    model, tokenizer = tiny
    prompts = PROMPTS + PROMPTS[:1]  # five rows: halves of two and three
    whole, halves = filled_store(model, tokenizer, prompts), filled_store(model, tokenizer, prompts)
    tokens = [3, 17, 5, 40, 9]
    with torch.no_grad():
        for _ in range(3):  # the second and third steps read the columns the halves wrote
            expected = decode_step(model, whole, tokens)
            found = decode_step(model, halves, tokens, beside=_beside)
            torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5)
            tokens = expected.argmax(dim=-1).tolist()
    assert halves.lengths == whole.lengths and (halves.start, halves.end) == (whole.start, whole.end)
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(halves.window(layer, 0)[0], whole.window(layer, 0)[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(halves.window(layer, 0)[1], whole.window(layer, 0)[1], rtol=1e-4, atol=1e-5)


def test_a_failing_half_fails_the_step_after_both_halves_ended_and_leaves_the_rows_unadvanced(tiny):
    model, tokenizer = tiny
    store = filled_store(model, tokenizer, PROMPTS)
    lengths, end = list(store.lengths), store.end
    finished = threading.Event()

    def failing(work):
        def result():
            finished.set()
            raise RuntimeError("the second half failed")
        return result

    with torch.no_grad(), pytest.raises(RuntimeError, match="second half"):
        decode_step(model, store, [1, 2, 3, 4], beside=failing)
    assert finished.is_set()
    assert store.lengths == lengths and store.end == end


def _held_slot(model):
    """A worker forward holding one of `model`'s slots (as a capture does) until released."""
    holding, release = threading.Event(), threading.Event()

    def worker():
        with _locks.forward_slot(model):
            holding.set()
            release.wait(WAIT)

    thread = threading.Thread(target=worker)
    thread.start()
    assert holding.wait(WAIT)
    return release, thread


def _recorded_prefills(monkeypatch, on_call=lambda count: None):
    """`prefill_many` as the engine calls it, recording each call's thread and prompt count."""
    calls, real = [], hf_batching.prefill_many

    def recorded(model, prompts, past=None):
        calls.append((threading.current_thread(), len(prompts)))
        on_call(len(calls))
        return real(model, prompts, past)

    monkeypatch.setattr(hf_batching, "prefill_many", recorded)
    return calls


def _assert_same_prefills(found, expected):
    assert len(found) == len(expected)
    for (logits, layers), (want_logits, want_layers) in zip(found, expected):
        torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-5)
        for (keys, values), (want_keys, want_values) in zip(layers, want_layers):
            torch.testing.assert_close(keys, want_keys, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(values, want_values, rtol=1e-4, atol=1e-5)


def test_a_spare_slot_is_taken_only_when_no_worker_forward_holds_one(tiny):
    model, _ = tiny
    with _locks.spare_slot(model) as spare:
        assert spare
        seen = []
        other = threading.Thread(target=lambda: seen.append(_locks.spare_slot(model).__enter__()))
        other.start()
        other.join()
        assert seen == [False]  # a second engine forward finds the spare core taken
    with _locks.forward_slot(model):
        with _locks.spare_slot(model) as spare:
            assert not spare  # inside a worker forward of this very thread
    release, worker = _held_slot(model)
    try:
        with _locks.spare_slot(model) as spare:
            assert not spare  # a worker forward runs: its core is not spare
    finally:
        release.set()
        worker.join(WAIT)
    with _locks.spare_slot(model) as spare:
        assert spare  # every slot was given back


def test_a_shared_engine_lock_has_no_spare_slot(tiny_tokenizer):
    model, _ = rclc.testing.tiny_model("llama", tokenizer=tiny_tokenizer)
    _locks.share_forward_slot(model, threading.Lock())
    with _locks.spare_slot(model) as spare:
        assert not spare


def test_a_prefill_batch_as_two_halves_equals_one_forward_and_is_counted(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(hf_batching, "parallel_forwards", lambda model: True)  # whatever this machine's cores
    engine = hf_batching.BatchingEngine(model, rclc.Batching(prefill_first_ms=1000))
    rows = [rows_of(model, tokenizer, text)[0] for text in PROMPTS]
    with torch.no_grad():
        expected = prefill_many(model, rows)
        found = engine._prefill_rows(model, rows, None)
    assert engine.stats.split_prefills == 1
    off = hf_batching.BatchingEngine(model, rclc.Batching(prefill_first_ms=0))
    with torch.no_grad():
        off._prefill_rows(model, rows, None)
    assert off.stats.split_prefills == 0  # no second forward outside that mode
    _assert_same_prefills(found, expected)


def test_a_large_prefill_batch_that_found_no_spare_core_looks_again_before_its_second_half(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(hf_batching, "parallel_forwards", lambda model: True)  # whatever this machine's cores
    monkeypatch.setattr(hf_batching, "BATCHED_TOKENS", 4)  # these prompts make a batch past it
    engine = hf_batching.BatchingEngine(model, rclc.Batching(prefill_first_ms=1000))
    rows = [rows_of(model, tokenizer, text)[0] for text in PROMPTS]
    with torch.no_grad():
        expected = prefill_many(model, rows)
    release, worker = _held_slot(model)  # no core is spare when the batch starts

    def free_a_core_during_the_first_half(call):
        if call == 1:  # the worker's forward ends while the first half runs
            release.set()
            worker.join(WAIT)

    calls = _recorded_prefills(monkeypatch, free_a_core_during_the_first_half)
    with torch.no_grad():
        found = engine._prefill_rows(model, rows, None)
    half = (len(rows) + 1) // 2
    assert calls[0] == (threading.current_thread(), half)  # the first half alone, in the prefill thread
    rest = len(rows) - half
    assert sorted(count for _, count in calls[1:]) == sorted([(rest + 1) // 2, rest // 2])  # quarters
    assert len({thread for thread, _ in calls[1:]}) == 2  # side by side, in two threads
    assert engine.stats.split_prefills == 1
    _assert_same_prefills(found, expected)


def test_a_prefill_batch_runs_its_halves_one_after_the_other_while_no_core_comes_free(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(hf_batching, "parallel_forwards", lambda model: True)
    monkeypatch.setattr(hf_batching, "BATCHED_TOKENS", 4)
    engine = hf_batching.BatchingEngine(model, rclc.Batching(prefill_first_ms=1000))
    rows = [rows_of(model, tokenizer, text)[0] for text in PROMPTS]
    with torch.no_grad():
        expected = prefill_many(model, rows)
    release, worker = _held_slot(model)
    try:
        calls = _recorded_prefills(monkeypatch)
        with torch.no_grad():
            found = engine._prefill_rows(model, rows, None)
    finally:
        release.set()
        worker.join(WAIT)
    half = (len(rows) + 1) // 2
    assert calls == [(threading.current_thread(), half), (threading.current_thread(), len(rows) - half)]
    assert engine.stats.split_prefills == 0
    _assert_same_prefills(found, expected)


def test_a_small_prefill_batch_without_a_spare_core_is_one_forward(tiny, monkeypatch):
    """Halves of a batch within `BATCHED_TOKENS` rows would each read the weights for few rows."""
    model, tokenizer = tiny
    monkeypatch.setattr(hf_batching, "parallel_forwards", lambda model: True)
    engine = hf_batching.BatchingEngine(model, rclc.Batching(prefill_first_ms=1000))
    rows = [rows_of(model, tokenizer, text)[0] for text in PROMPTS]
    assert len(rows) * max(int(row.shape[0]) for row in rows) <= hf_batching.BATCHED_TOKENS
    release, worker = _held_slot(model)
    try:
        calls = _recorded_prefills(monkeypatch)
        with torch.no_grad():
            engine._prefill_rows(model, rows, None)
    finally:
        release.set()
        worker.join(WAIT)
    assert calls == [(threading.current_thread(), len(rows))]


class PrefillGate:
    """Once armed, the engine's decode thread waits in its next forward until the prefill
    thread has begun its next forward, which waits until released. So the other prompt is
    under prefill before the decoding sequence can take another step, however fast either
    runs (a prompt the prefix store holds forwards only its last position: any length)."""

    def __init__(self, model, waiting=1):
        self.armed, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()
        self.engine, self.waiting = engine_for(model), waiting
        self.handle = model.model.register_forward_pre_hook(self._hook)

    def _all_waiting(self):
        """The decode thread's next forward also waits until `waiting` prompts wait for or
        are under prefill (later ones queue behind the blocked prefill)."""
        deadline = time.monotonic() + WAIT
        while self.engine.report()["waiting"] < self.waiting and time.monotonic() < deadline:
            time.sleep(0.01)

    def _hook(self, module, args):
        if not self.armed.is_set() or self.release.is_set():
            return
        thread = threading.current_thread().name
        if thread == "rclc-batching-decode":
            self.entered.wait(WAIT)
            self._all_waiting()
        elif thread == "rclc-batching-prefill" and not self.entered.is_set():
            self.entered.set()
            self.release.wait(WAIT)

    def remove(self):
        self.release.set()
        self.handle.remove()


def a_while_b_prefills(model, tokenizer, a_may_end_within, stop_a=None, decoding=1, prompts=1):
    """Generation A (with `decoding - 1` others) decodes; then B (with `prompts - 1` others)
    starts and its prefill blocks. Returns A's token count once every B waited for or was
    under prefill, its count once A ended or `a_may_end_within` seconds passed, whether A had
    ended then, and A's and B's results. `stop_a`: A's stop event, set once B's prefill began."""
    agents = [rclc.bind(model, tokenizer) for _ in range(decoding + prompts)]
    gate = PrefillGate(model, waiting=prompts)
    a_ended = threading.Event()
    # A's tokens are counted where the engine adds them (its sequence), not by on_token, which
    # the waiting thread calls from a queue and may run behind the engine on a loaded machine.
    # A's sequence is found by its stop event (one that is never set when stop_a is None).
    stop_of_a = stop_a if stop_a is not None else threading.Event()
    started: set[int] = set()  # the decoding generations that have decoded a token
    found: dict[str, object] = {}

    def on_token_of(which):
        def on_token(index, text):
            if index >= 1:
                started.add(which)
                if len(started) == decoding:
                    gate.armed.set()
        return on_token

    async def main():
        async with anyio.create_task_group() as group:
            async def run_a():
                found["a"] = await agents[0].generate(PROMPTS[0], max_new_tokens=12, on_token=on_token_of(0), stop=stop_of_a)
                a_ended.set()

            async def run_other(which):
                await agents[which].generate(PROMPTS[which % len(PROMPTS)], max_new_tokens=12, on_token=on_token_of(which))

            async def run_b(which):
                found.setdefault("b", []).append(await agents[which].generate(PROMPTS[3], max_new_tokens=4))

            group.start_soon(run_a)
            for which in range(1, decoding):
                group.start_soon(run_other, which)
            await anyio.to_thread.run_sync(gate.armed.wait, WAIT)
            for which in range(decoding, decoding + prompts):
                group.start_soon(run_b, which)
            await anyio.to_thread.run_sync(gate.entered.wait, WAIT)
            await anyio.to_thread.run_sync(gate._all_waiting)
            [sequence_of_a] = [sequence for sequence in list(gate.engine._active) if sequence.stop is stop_of_a]
            found["at_prefill"] = len(sequence_of_a.tokens)
            if stop_a is not None:
                stop_a.set()
            await anyio.to_thread.run_sync(a_ended.wait, a_may_end_within)
            found["later"], found["ended"] = len(sequence_of_a.tokens), a_ended.is_set()
            gate.release.set()

    try:
        anyio.run(main)
    finally:
        gate.remove()
    return found


def test_decode_waits_for_a_prompt_under_prefill_and_decodes_it_in_the_same_steps(tiny, options):
    model, tokenizer = tiny
    options(prefill_first_ms=WAIT * 1000)
    alone = generate_alone(model, tokenizer, PROMPTS[0], max_new_tokens=12)
    assert len(alone.token_ids) > 4  # room to see A wait
    engine = engine_for(model)
    held, sizes = engine.report()["held_steps"], engine.report()["batch_sizes"]
    with engine.tracing() as trace:
        found = a_while_b_prefills(model, tokenizer, a_may_end_within=1.0)  # a second: far more than its steps take
    # at most the step under way when B arrived, then none while B's prefill was blocked
    assert not found["ended"] and found["later"] <= found["at_prefill"] + 1
    assert engine.report()["held_steps"] > held
    after = engine.report()["batch_sizes"]
    assert after.get("2", 0) > sizes.get("2", 0)  # then both decoded in the same steps
    assert_equal_or_near_tie(list(found["a"].token_ids), list(alone.token_ids), trace)


def test_a_held_sequence_asked_to_stop_ends_without_waiting_for_the_prompt_under_prefill(tiny, options):
    model, tokenizer = tiny
    options(prefill_first_ms=10 * WAIT * 1000)  # far longer than the test waits
    found = a_while_b_prefills(model, tokenizer, a_may_end_within=WAIT, stop_a=threading.Event())
    assert found["ended"] and found["a"].stopped
    assert found["later"] <= found["at_prefill"] + 2  # the step under way, then the one that sees the stop


@pytest.mark.parametrize("bound_ms", [0, 20])
def test_decode_goes_on_without_the_prompt_when_prefill_first_is_off_or_its_bound_passed(tiny, options, bound_ms):
    model, tokenizer = tiny
    options(prefill_first_ms=bound_ms)
    found = a_while_b_prefills(model, tokenizer, a_may_end_within=WAIT)
    assert found["ended"] and found["later"] == len(found["a"].token_ids)  # A ended while B's prefill was blocked
    assert found["b"][0].tokens > 0


def test_decode_does_not_wait_for_fewer_prompts_than_the_batch_decodes(tiny, options):
    # two sequences decode, one prompt is under prefill: it would not double the batch
    model, tokenizer = tiny
    options(prefill_first_ms=10 * WAIT * 1000)  # a hold would outlast the test's wait
    found = a_while_b_prefills(model, tokenizer, a_may_end_within=WAIT, decoding=2, prompts=1)
    assert found["ended"] and found["later"] == len(found["a"].token_ids)
    assert found["b"][0].tokens > 0


def test_decode_waits_for_as_many_prompts_as_the_batch_decodes(tiny, options):
    model, tokenizer = tiny
    options(prefill_first_ms=WAIT * 1000)
    found = a_while_b_prefills(model, tokenizer, a_may_end_within=1.0, decoding=2, prompts=2)
    assert not found["ended"] and found["later"] <= found["at_prefill"] + 1
    assert [result.tokens > 0 for result in found["b"]] == [True, True]


def test_prefill_first_is_checked_and_reported(tiny, options):
    model, _ = tiny
    assert rclc.Batching().prefill_first_ms == 1000.0  # on by default (docs/performance.md)
    with pytest.raises(rclc.RclcError, match="prefill_first_ms"):
        rclc.Batching(prefill_first_ms=-1)
    with pytest.raises(rclc.RclcError, match="prefill_first_ms"):
        rclc.Batching(prefill_first_ms=float("inf"))
    assert options(prefill_first_ms=250).prefill_first_ms == 250.0
    report = rclc.batching_report(model)
    assert report["prefill_first_ms"] == 250.0
    assert {"held_steps", "split_steps", "split_prefills"} <= set(report)


def test_sixteen_generations_decode_in_split_steps_with_their_unbatched_tokens(tiny, options, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(hf_batching, "parallel_forwards", lambda model: True)  # whatever this machine's cores
    options(prefill_first_ms=WAIT * 1000)
    prompts = [f"{PROMPTS[i % 4]} Number {i}." for i in range(16)]
    engine = engine_for(model)
    split = engine.report()["split_steps"]

    joined = threading.Event()

    def until_all_joined(module, args):
        """The decode thread's first forwards wait until all 16 are in the batch, however
        slowly their callers submit them (then a step of 16 rows follows)."""
        if threading.current_thread().name == "rclc-batching-decode" and not joined.is_set():
            deadline = time.monotonic() + WAIT
            while engine._in_batch() < len(prompts) and time.monotonic() < deadline:
                time.sleep(0.001)
            joined.set()

    with engine.tracing() as trace:
        alone = [generate_alone(model, tokenizer, prompt, max_new_tokens=6) for prompt in prompts]
        handle = model.model.register_forward_pre_hook(until_all_joined)
        try:
            batched = concurrently([rclc.bind(model, tokenizer) for _ in prompts], prompts,
                                   [{"max_new_tokens": 6} for _ in prompts])
        finally:
            handle.remove()
    for together, single in zip(batched, alone):
        assert_equal_or_near_tie(list(together.token_ids), list(single.token_ids), trace)
    assert engine.report()["split_steps"] > split
