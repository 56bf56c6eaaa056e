"""Each rclc error class is what its situation raises (and stays a ValueError/IndexError/RuntimeError)."""

from __future__ import annotations

import types

import anyio
import pytest

import rclc
from rclc import errors, testing, transfer_sync
from rclc.vllm import get_capture, require_idle
from tests.helpers.agents import HISTORY_A, HISTORY_B, QUESTION, history


@pytest.fixture
def pair(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    sender = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    receiver = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=4)
    return sender, receiver


def test_unsupported_model(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer)
    model.train()
    with pytest.raises(errors.UnsupportedModelError, match="training mode"):
        rclc.bind(model, tokenizer)
    with pytest.raises(errors.UnsupportedModelError, match="config"):
        rclc.bind(object(), tokenizer)


def test_incompatible_sender_and_receiver(pair, tiny_tokenizer):
    sender, _ = pair
    other, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, seed=1)
    stranger = rclc.bind(other, tokenizer, messages=history(HISTORY_B))
    with pytest.raises(errors.IncompatibleStateError, match="receiver"):
        transfer_sync(sender, stranger, QUESTION)


def test_context_limit(pair):
    sender, receiver = pair
    transfer_sync(sender, receiver, QUESTION)
    with pytest.raises(errors.ContextLimitError, match="context space"):
        receiver.pop(max_new_tokens=receiver.context_limit)


def test_agent_lifecycle_and_empty_inbox(pair):
    sender, receiver = pair
    with pytest.raises(errors.EmptyInboxError, match="empty receiver") as caught:
        receiver.pop()
    assert isinstance(caught.value, IndexError) and isinstance(caught.value, ValueError)
    transfer_sync(sender, receiver, QUESTION)
    receiver.pop()
    with pytest.raises(errors.AgentStateError, match="pending"):
        transfer_sync(receiver, sender, QUESTION)
    with pytest.raises(errors.AgentStateError, match="no state"):
        transfer_sync(rclc.bind(sender.model, sender.tokenizer), receiver, QUESTION)


def test_snapshot(pair, tmp_path):
    sender, _ = pair
    path = tmp_path / "not-a-snapshot.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(errors.SnapshotError, match="path"):
        anyio.run(sender.load, path)


def test_selector_and_reasoning_results(pair):
    sender, receiver = pair

    def duplicates(state, request_ids, budget):
        return [0, 0]

    def wrong_type(state, *, max_positions, request=None):
        return "not a state"

    with pytest.raises(errors.SelectorError, match="duplicate"):
        transfer_sync(sender, receiver, QUESTION, selector=duplicates)
    with pytest.raises(errors.ReasoningError, match="SenderState"):
        transfer_sync(sender, receiver, QUESTION, reasoning=wrong_type)
    assert len(receiver) == 0


def test_conditions_of_the_moment_are_runtime_errors():
    with pytest.raises(errors.CaptureError, match="no capture") as caught:
        get_capture("never-registered")
    assert isinstance(caught.value, RuntimeError)
    engine = types.SimpleNamespace(vllm_config=None, has_unfinished_requests=lambda: True)
    with pytest.raises(errors.EngineBusyError, match="unfinished requests") as caught:
        require_idle(types.SimpleNamespace(llm_engine=engine))
    assert isinstance(caught.value, RuntimeError)
