"""`Agent.generate(from_state=True)` (a tool loop's next turn) through the HF batching engine.

The engine prefills a from-state sequence over the retained state's cache (only the
positions it lacks are forwarded, see test_agent_from_state.py), so the sequence joins the
batch like any other: beside concurrent generations it picks the tokens it picks alone
(or differs first at a float32 near-tie, shown by the trace), and the retained state's
cache tensors are never written.
"""

from __future__ import annotations

import anyio
import pytest
import torch

import rclc
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers
from rclc.backends.hf_batching import engine_for

PROMPT = "<|im_start|>user\nWho owns Cedar?<|im_end|>\n<|im_start|>assistant\n"
TOOL_TURN = "<|im_end|>\n<|im_start|>tool\nCedar is owned by Alice.<|im_end|>\n<|im_start|>assistant\n"
OTHERS = ["A somewhat longer prompt that takes more positions.", "Short one.", "Middle length prompt here."]


async def _tool_turn(agent):
    await agent.generate(PROMPT, max_new_tokens=5)
    await agent.append(TOOL_TURN)


def test_from_state_generation_batches_beside_others_and_keeps_the_retained_cache(tiny):
    model, tokenizer = tiny
    engine = engine_for(model)
    alone_agent = rclc.bind(model, tokenizer)
    anyio.run(_tool_turn, alone_agent)
    alone = anyio.run(lambda: alone_agent.generate(from_state=True, max_new_tokens=12))

    agent = rclc.bind(model, tokenizer)
    anyio.run(_tool_turn, agent)
    held = agent.sender_state()
    before = [(k.clone(), v.clone()) for k, v in cache_layers(held.past_key_values)]
    others = [rclc.bind(model, tokenizer) for _ in OTHERS]
    results: list = [None] * (len(OTHERS) + 1)
    sizes_before = engine.report()["batch_sizes"]

    async def main():
        async with anyio.create_task_group() as group:
            async def other(index):
                results[index + 1] = await others[index].generate(OTHERS[index], max_new_tokens=24)

            for index in range(len(OTHERS)):
                group.start_soon(other, index)
            results[0] = await agent.generate(from_state=True, max_new_tokens=12)

    with engine.tracing() as trace:
        anyio.run(main)
    batched = results[0]
    if batched.token_ids != alone.token_ids:
        first = next(i for i, (a, b) in enumerate(zip(batched.token_ids, alone.token_ids)) if a != b)
        margins = [entry.margins for entry in trace if entry.tokens == tuple(batched.token_ids)]
        assert margins and margins[0][first] < 1e-4, (first, batched.token_ids, alone.token_ids)
    else:
        assert torch.equal(agent.sender_state().token_ids, alone_agent.sender_state().token_ids)
    assert agent.sender_state().positions == held.positions + batched.tokens
    for (k, v), (k0, v0) in zip(cache_layers(held.past_key_values), before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    sizes_after = engine.report()["batch_sizes"]
    assert any(int(size) > 1 and sizes_after[size] > sizes_before.get(size, 0) for size in sizes_after)


def test_a_cache_that_is_not_a_prefix_of_the_rows_is_refused(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    agent = rclc.bind(model, tokenizer)
    anyio.run(_tool_turn, agent)
    state = agent.sender_state()
    backend = agent._backend
    inputs = backend.state_inputs(state, 4)
    inputs["inputs_embeds"] = inputs["inputs_embeds"][:, :2]  # fewer rows than the cache holds
    with pytest.raises(rclc.IncompatibleStateError, match="proper prefix"):
        backend.generate(inputs, rclc.Sampling(), on_token=None, stop=None)
