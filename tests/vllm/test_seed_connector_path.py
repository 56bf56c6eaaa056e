"""An engine configured exactly as the seed's API text writes it captures as before
(issue 24 item 13): `kv_connector="RCCCaptureConnector"`,
`kv_connector_module_path="rclc.capture.connector"` (the path before the layout change)."""

from __future__ import annotations

import torch

import pytest
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc import _cache, models
from rclc.vllm import check_engine, prefill_state, shared_view
from rclc.vllm.capture import registry
from tests.helpers.vllm_engines import running_engine, save_tiny

pytestmark = pytest.mark.vllm

SEED_CONNECTOR = {
    "kv_connector": "RCCCaptureConnector",
    "kv_connector_module_path": "rclc.capture.connector",
    "kv_role": "kv_both",
}


# issue 24 item 13: ModuleNotFoundError: No module named 'rclc.capture'
def test_an_engine_configured_as_the_seed_writes_it_captures(tmp_path):
    save_tiny(tmp_path, "llama")
    model, tokenizer = models.load(str(tmp_path))
    ids = torch.tensor(tokenizer("The Cedar project is owned by Alice. Who owns Cedar?")["input_ids"], dtype=torch.int64)
    with running_engine(tmp_path, kv_transfer_config=dict(SEED_CONNECTOR)) as llm:
        assert check_engine(llm) == []
        state = prefill_state(llm, shared_view(llm), tokenizer, ids)
    assert registry.entries() == {}
    reference = _cache.prefill(model, model.get_input_embeddings().weight[ids])
    for (keys, values), (ref_keys, ref_values) in zip(_cache.cache_layers(state.past_key_values),
                                                      _cache.cache_layers(reference)):
        torch.testing.assert_close(keys, ref_keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(values, ref_values, atol=1e-5, rtol=1e-5)
