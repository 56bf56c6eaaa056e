"""An ended generation's last token is forwarded in one more decode step (issue 28): the
state an agent keeps after generating covers every token without a lone forward afterwards
(which read every weight for one row, under the preparation lock), the position equals what a
prefill of the same rows computes up to float32 rounding, and a failure of that step costs
the generation nothing."""

from __future__ import annotations

import anyio
import torch

import rclc
# private on purpose: the test checks the engine's statistics and the cache it hands back
from rclc._cache import backbone, cache_layers, cache_length, prefill
from rclc.backends import hf as hf_backend
from rclc.backends.hf_batching import engine_for

from tests.helpers.batching import PROMPTS, concurrently


def _generate(model, tokenizer, prompt, **options):
    agent = rclc.bind(model, tokenizer)
    result = anyio.run(lambda: agent.generate(prompt, **options))
    return agent, result


def _no_lone_forward(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the continuation forwarded the last token alone")

    monkeypatch.setattr(hf_backend, "extend", refuse)


def _assert_state_is_its_rows_prefilled(model, state):
    assert cache_length(state.past_key_values) == state.positions
    reference = cache_layers(prefill(model, state.input_embeds))
    for (keys, values), (ref_keys, ref_values) in zip(cache_layers(state.past_key_values), reference):
        torch.testing.assert_close(keys[..., -1, :], ref_keys[..., -1, :], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(values[..., -1, :], ref_values[..., -1, :], rtol=1e-4, atol=1e-5)


def test_a_generation_leaves_with_its_last_token_forwarded(tiny, monkeypatch):
    model, tokenizer = tiny
    engine = engine_for(model)
    before = engine.report()["closing_rows"]
    _no_lone_forward(monkeypatch)
    agent, result = _generate(model, tokenizer, PROMPTS[1], max_new_tokens=6)
    assert len(result.token_ids) == 6
    _assert_state_is_its_rows_prefilled(model, agent.sender_state())
    assert engine.report()["closing_rows"] == before + 1
    assert engine.report()["active"] == 0


def test_a_generation_ended_by_its_first_token_joins_only_to_forward_it(tiny, monkeypatch):
    model, tokenizer = tiny
    _no_lone_forward(monkeypatch)
    agent, result = _generate(model, tokenizer, PROMPTS[0], max_new_tokens=1)
    assert len(result.token_ids) == 1
    _assert_state_is_its_rows_prefilled(model, agent.sender_state())


def test_concurrent_generations_each_close_in_the_batch(tiny, monkeypatch):
    model, tokenizer = tiny
    options = [{"max_new_tokens": n} for n in (3, 9, 5)]
    engine = engine_for(model)
    before = engine.report()["closing_rows"]
    _no_lone_forward(monkeypatch)
    agents = [rclc.bind(model, tokenizer) for _ in options]
    batched = concurrently(agents, PROMPTS[:3], options)
    assert [len(result.token_ids) for result in batched] == [3, 9, 5]
    assert engine.report()["closing_rows"] == before + 3
    for agent in agents:
        _assert_state_is_its_rows_prefilled(model, agent.sender_state())


def test_a_failing_closing_step_keeps_the_generation(tiny):
    """The step that only forwards the last token fails: the generation keeps its tokens, the
    continuation prefills the rows afresh, and the engine counts no failure."""
    model, tokenizer = tiny
    reference, alone = _generate(model, tokenizer, PROMPTS[2], max_new_tokens=4)
    last = reference.sender_state().positions - 1  # where the fourth token sits: only the closing step forwards it
    engine = engine_for(model)
    failed = engine.report()["failed"]
    closing = []

    def fail_the_closing_step(module, args, kwargs):
        ids, positions = kwargs.get("input_ids"), kwargs.get("position_ids")
        if ids is not None and tuple(ids.shape) == (1, 1) and int(positions.reshape(-1)[0]) == last:
            closing.append(1)
            raise RuntimeError("closing step fault injected")
        return None

    handle = backbone(model).register_forward_pre_hook(fail_the_closing_step, with_kwargs=True)
    try:
        agent, result = _generate(model, tokenizer, PROMPTS[2], max_new_tokens=4)
    finally:
        handle.remove()
    assert closing == [1], "the closing step ran, once"
    assert result.token_ids == alone.token_ids
    _assert_state_is_its_rows_prefilled(model, agent.sender_state())
    assert engine.report()["failed"] == failed and engine.report()["active"] == 0
