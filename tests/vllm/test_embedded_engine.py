"""The embedded SmolLM2-135M (tied embeddings, 30 layers) on vLLM's CPU backend vs HF."""

from __future__ import annotations

import pytest
import torch

# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc import _cache, models
from rclc.vllm.capture import registry
from rclc.vllm import check_engine, model_from_vllm, prefill_state, shared_view, view_state_dict
from tests.helpers.vllm_engines import running_engine, vllm

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ATOL = 1e-4  # 30 float32 layers through different GEMM kernels (oneDNN vs torch)


@pytest.fixture(scope="module")
def embedded_hf():
    return models.load("embedded")


@pytest.fixture(scope="module")
def llm():
    path = models.local_dir("embedded")
    with running_engine(path, max_model_len=2048, kv_cache_memory_bytes=256 * 2**20) as engine:
        yield engine


def _prompt_ids(tokenizer) -> torch.Tensor:
    messages = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. Who owns Cedar?"},
    ]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return ids["input_ids"][0].to(torch.int64)


def test_configuration_and_tied_head(llm):
    assert check_engine(llm) == []
    view = shared_view(llm)
    assert view.config.tie_word_embeddings
    assert view.lm_head.weight is view.model.embed_tokens.weight


def test_captured_kv_equals_hf(llm, embedded_hf):
    model, tokenizer = embedded_hf
    ids = _prompt_ids(tokenizer)
    state = prefill_state(llm, shared_view(llm), tokenizer, ids)
    reference = _cache.prefill(model, model.get_input_embeddings().weight[ids])
    for (keys, values), (ref_keys, ref_values) in zip(
        _cache.cache_layers(state.past_key_values), _cache.cache_layers(reference)
    ):
        torch.testing.assert_close(keys, ref_keys, atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(values, ref_values, atol=ATOL, rtol=ATOL)
    assert registry.entries() == {}


def test_view_logits_equal_hf(llm, embedded_hf):
    model, tokenizer = embedded_hf
    ids = _prompt_ids(tokenizer)[None]
    view = model_from_vllm(llm)
    with torch.no_grad():
        torch.testing.assert_close(view(ids).logits, model(ids).logits, atol=ATOL * 10, rtol=1e-4)


def test_prompt_embeds_and_token_generation_agree_with_hf(llm, embedded_hf):
    model, tokenizer = embedded_hf
    ids = _prompt_ids(tokenizer)
    params = vllm.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    by_ids = list(llm.generate({"prompt_token_ids": ids.tolist()}, params, use_tqdm=False)[0].outputs[0].token_ids)
    rows = model.get_input_embeddings().weight[ids].detach()
    by_rows = list(llm.generate({"prompt_embeds": rows}, params, use_tqdm=False)[0].outputs[0].token_ids)
    assert by_rows == by_ids
    # HF greedy without stopping at EOS (vLLM's ignore_eos does not mask EOS either).
    weight = model.get_input_embeddings().weight
    hidden, cache = _cache.forward_rows(model, None, inputs_embeds=weight[ids][None], start=0)
    greedy = []
    with torch.no_grad():
        for _ in range(16):
            token = int(model.lm_head(hidden[0, -1]).argmax())
            greedy.append(token)
            hidden, cache = _cache.forward_rows(model, cache, input_ids=torch.tensor([[token]]))
    assert greedy == by_ids


def test_view_state_dict_is_the_checkpoint_bitwise(llm, embedded_hf):
    """Packed projections are recovered exactly, so weight digests match HF's."""
    model, _ = embedded_hf
    expected = model.state_dict()
    got = view_state_dict(shared_view(llm))
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
