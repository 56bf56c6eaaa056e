"""The vLLM graph runtime's pieces that need no engine: engine arguments, environment refusal."""

from __future__ import annotations

import pytest

from rclc import testing
from rclc_graph.executors import vllm_engine as vllm_runtime


def test_engine_arguments_size_the_kv_pool_from_the_checkpoint(tmp_path):
    model, tokenizer = testing.tiny_model("llama", head_dim=64, max_positions=4096)
    model.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    arguments = vllm_runtime.engine_arguments(str(tmp_path), "float32")
    assert arguments["max_model_len"] == 4096
    assert arguments["enforce_eager"] and arguments["enable_prompt_embeds"]
    assert arguments["enable_prefix_caching"] is False
    assert arguments["kv_transfer_config"]["kv_connector"] == "RCLCCaptureConnector"
    per_position = 2 * 2 * 2 * 64 * 4  # layers * (K, V) * kv heads * head dim * float32 bytes
    wanted = vllm_runtime.KV_CACHE_SEQUENCES * (4096 + vllm_runtime.BLOCK_SLACK) * per_position
    assert arguments["kv_cache_memory_bytes"] == max(vllm_runtime.MINIMUM_KV_CACHE_BYTES, wanted)
    half = vllm_runtime.engine_arguments(str(tmp_path), "bfloat16")
    assert half["dtype"] == "bfloat16"


def test_multiprocessing_engines_are_refused(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        vllm_runtime._require_in_process()
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    vllm_runtime._require_in_process()
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
