"""A second engine on the same checkpoint in one process (a restarted graph pool, a notebook).

vLLM 0.30 then hands out an engine tokenizer carrying its `<prompt_embeds>` placeholder
past the vocabulary; agents on it must still match HF agents and snapshots of the checkpoint.
"""

from __future__ import annotations

import pytest

import rclc
from rclc import models
from rclc.vllm.capture import registry
from rclc.snapshot import model_identity
from rclc.state import VLLM_PLACEHOLDER
from rclc.vllm.engine import engine_tokenizer
from tests.helpers.vllm_engines import running_engine, save_tiny

pytestmark = pytest.mark.vllm


def test_second_engine_agents_still_match_the_checkpoint(tmp_path):
    save_tiny(tmp_path, "llama")
    model, tokenizer = models.load(str(tmp_path))
    with running_engine(tmp_path) as first:
        assert VLLM_PLACEHOLDER not in engine_tokenizer(first).get_vocab()
        identity = model_identity(rclc.bind(first, backend="vllm").model, engine_tokenizer(first))
    with running_engine(tmp_path) as second:
        placeholder = engine_tokenizer(second).get_vocab().get(VLLM_PLACEHOLDER)
        assert placeholder == model.get_input_embeddings().weight.shape[0]  # vLLM 0.30 behaviour this test covers
        agent = rclc.bind(second, tokenizer, backend="vllm", prompt="The Cedar project is owned by Alice.")
        assert model_identity(agent.model, agent.tokenizer) == identity == model_identity(model, tokenizer)
        receiver = rclc.bind(model, tokenizer)
        rclc.transfer_sync(agent, receiver, "Who owns Cedar?")
        sender = rclc.bind(model, tokenizer, prompt="The Birch project is owned by Bob.")
        rclc.transfer_sync(sender, agent, "Who owns Birch?")
        assert len(receiver) == len(agent) == 1
    assert registry.entries() == {}
