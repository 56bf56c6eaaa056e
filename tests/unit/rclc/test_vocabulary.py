"""vLLM's `<prompt_embeds>` placeholder (past the embedding table) changes no identity; other tokens do."""

from __future__ import annotations

import copy

import pytest

import rclc
from rclc import testing
from rclc.snapshot import model_identity
from rclc.state import VLLM_PLACEHOLDER, checkpoint_vocabulary


def _with(tokenizer, token):
    extended = copy.deepcopy(tokenizer)
    extended.add_special_tokens({"additional_special_tokens": [token]})
    return extended


def test_the_vllm_placeholder_does_not_count(tiny_llama):
    model, tokenizer = tiny_llama
    engine_like = _with(tokenizer, VLLM_PLACEHOLDER)
    rows = model.get_input_embeddings().weight.shape[0]
    assert engine_like.get_vocab()[VLLM_PLACEHOLDER] == rows
    assert checkpoint_vocabulary(engine_like, rows) == tokenizer.get_vocab()
    assert model_identity(model, engine_like) == model_identity(model, tokenizer)
    sender = rclc.sender_from_hf(model, tokenizer, "The Cedar project is owned by Alice.")
    rclc.HFReceiver(model, engine_like).validate_sender(sender)


def test_other_vocabulary_changes_still_count(tiny_llama):
    model, tokenizer = tiny_llama
    sender = rclc.sender_from_hf(model, tokenizer, "The Cedar project is owned by Alice.")
    for other in (_with(tokenizer, "<|extra|>"), testing.tiny_tokenizer(vocab_size=300)):
        assert model_identity(model, other) != model_identity(model, tokenizer)
        with pytest.raises(ValueError, match="vocabulary differs"):
            rclc.HFReceiver(model, other).validate_sender(sender)
