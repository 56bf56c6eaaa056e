"""The other supported families (Qwen3, Qwen2, Mistral) on tiny random models, one engine each.

Engines start one after another (vLLM keeps one worker-side connector per process).
"""

from __future__ import annotations

import pytest
import torch

# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc import _cache, models
from rclc.vllm.capture import registry
from rclc.vllm import prefill_state, shared_view, view_state_dict
from tests.helpers.vllm_engines import running_engine, save_tiny

pytestmark = pytest.mark.vllm

ATOL = 1e-5


def _ids(tokenizer) -> torch.Tensor:
    text = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. Who owns Cedar? "
    return torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral"])
def test_other_families_view_and_capture(tmp_path, family):
    """One short engine per family: view logits, state dict and captured KV equal HF's."""
    save_tiny(tmp_path, family)
    model, tokenizer = models.load(str(tmp_path))
    ids = _ids(tokenizer)
    with running_engine(tmp_path) as engine:
        view = shared_view(engine)
        assert type(view).__name__ == type(model).__name__
        with torch.no_grad():
            torch.testing.assert_close(view(ids[None]).logits, model(ids[None]).logits, atol=ATOL, rtol=1e-5)
        expected = model.state_dict()
        got = view_state_dict(view)
        assert list(got) == list(expected)
        assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())
        state = prefill_state(engine, view, tokenizer, ids)
        reference = _cache.prefill(model, model.get_input_embeddings().weight[ids])
        for (keys, values), (ref_keys, ref_values) in zip(
            _cache.cache_layers(state.past_key_values), _cache.cache_layers(reference)
        ):
            torch.testing.assert_close(keys, ref_keys, atol=ATOL, rtol=1e-5)
            torch.testing.assert_close(values, ref_values, atol=ATOL, rtol=1e-5)
    assert registry.entries() == {}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_pages_use_the_same_layout(tmp_path, dtype):
    """16-bit engines keep the CPU page layout; results agree with HF within a few ulps."""
    save_tiny(tmp_path, "llama", dtype=dtype)
    model, tokenizer = models.load(str(tmp_path), dtype=dtype)
    ids = _ids(tokenizer)
    with running_engine(tmp_path, dtype=dtype) as engine:
        state = prefill_state(engine, shared_view(engine), tokenizer, ids)
    reference = _cache.prefill(model, model.get_input_embeddings().weight[ids])
    tolerance = 2 ** -7 if dtype == "bfloat16" else 2 ** -10
    for (keys, values), (ref_keys, ref_values) in zip(
        _cache.cache_layers(state.past_key_values), _cache.cache_layers(reference)
    ):
        assert keys.dtype == getattr(torch, dtype)
        torch.testing.assert_close(keys, ref_keys, atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(values, ref_values, atol=tolerance, rtol=tolerance)
