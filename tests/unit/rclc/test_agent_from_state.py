"""Agent.generate(from_state=True): continue the retained state after an append, reusing its cache.

A tool loop (rclc_graph's tool-calling agents) generates, appends a tool result with
`Agent.append`, and generates again. The second generation must start from everything the
agent holds without prefilling it again: on HF only the state's last position is forwarded
before the first new token. What it records must equal generating from the same IDs as a
fresh prompt (greedy), and every refusal leaves the agent as it was.
"""

from __future__ import annotations

import anyio
import pytest
import torch

import rclc
from rclc import RclcError
from tests.helpers.agents import assert_unchanged, counted_forwards, ids_of, view

PROMPT = "<|im_start|>user\nWho owns Cedar?<|im_end|>\n<|im_start|>assistant\n"
TOOL_TURN = "<|im_end|>\n<|im_start|>tool\nCedar is owned by Alice.<|im_end|>\n<|im_start|>assistant\n"


async def _generate_append_generate(agent):
    first = await agent.generate(PROMPT, max_new_tokens=5)
    await agent.append(TOOL_TURN)
    held = agent.sender_state().positions
    second = await agent.generate(from_state=True, max_new_tokens=6)
    return first, held, second


def test_from_state_forwards_only_the_last_position_then_decodes(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, max_new_tokens=8)
    anyio.run(agent.generate, PROMPT)
    anyio.run(agent.append, TOOL_TURN)
    held = agent.sender_state().positions
    with counted_forwards(model) as calls:
        result = anyio.run(lambda: agent.generate(from_state=True, max_new_tokens=4))
    assert calls[0] == 1, f"the first forward re-read {calls[0]} positions of a {held}-position state"
    assert all(count == 1 for count in calls)
    assert agent.sender_state().positions == held + result.tokens


def test_from_state_equals_generating_from_the_same_ids_as_a_prompt(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, max_new_tokens=8)
    first, held, second = anyio.run(_generate_append_generate, agent)
    state = agent.sender_state()
    assert state.positions == held + second.tokens
    # The same IDs as one prompt, generated from scratch, give the same tokens (greedy).
    history = state.token_ids[:held].unsqueeze(0)
    fresh = rclc.bind(model, tokenizer, max_new_tokens=8)
    again = anyio.run(lambda: fresh.generate(history, max_new_tokens=6))
    assert again.token_ids == second.token_ids
    assert torch.equal(fresh.sender_state().token_ids, state.token_ids)
    expected = torch.cat([ids_of(tokenizer, PROMPT)[0], torch.tensor(first.token_ids),
                          ids_of(tokenizer, TOOL_TURN)[0], torch.tensor(second.token_ids)])
    assert torch.equal(state.token_ids, expected)


def test_from_state_with_refresh_matches_a_load(tiny, tmp_path):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, max_new_tokens=8)

    async def run():
        await agent.generate(PROMPT, max_new_tokens=4)
        await agent.append(TOOL_TURN)
        await agent.generate(from_state=True, max_new_tokens=4, refresh=True)
        await agent.save(tmp_path / "a.safetensors")

    anyio.run(run)
    loaded = rclc.bind(model, tokenizer)
    anyio.run(loaded.load, tmp_path / "a.safetensors")
    assert torch.equal(loaded.sender_state().token_ids, agent.sender_state().token_ids)


def test_from_state_refusals_leave_the_agent_as_it_was(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    empty = rclc.bind(model, tokenizer)
    with pytest.raises(RclcError, match="no state"):
        anyio.run(lambda: empty.generate(from_state=True))
    agent = rclc.bind(model, tokenizer, max_new_tokens=4, context_limit=64)
    anyio.run(agent.generate, PROMPT)
    before = view(agent)
    with pytest.raises(RclcError, match="from_state"):
        anyio.run(lambda: agent.generate(PROMPT, from_state=True))
    with pytest.raises(RclcError, match="from_state"):
        anyio.run(lambda: agent.generate(from_state=1))
    with pytest.raises(rclc.ContextLimitError, match="context"):
        anyio.run(lambda: agent.generate(from_state=True, max_new_tokens=60))
    assert_unchanged(agent, before)
