"""Unsupported engine configurations are refused with UnsupportedModelError (a ValueError), at
construction or binding.

Most cases build vLLM's configuration objects with EngineArgs (no engine started) and
construct the connector directly, as vLLM's factory would; one case starts a real engine
to show the refusal reaches `vllm.LLM(...)`, and one binds an engine built without capture.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rclc.vllm import check_engine, model_from_vllm
from tests.helpers.vllm_engines import CONNECTOR, engine_arguments, running_engine, save_tiny, vllm
from tests.paths import ROOT

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama-h64-refusals")
    save_tiny(directory, "llama")
    return directory


def _config(path, **overrides):
    from vllm.engine.arg_utils import EngineArgs

    arguments = engine_arguments(path, **overrides)
    return EngineArgs(**arguments).create_engine_config()


def _cache_config(*specs):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)


def _full(**changes):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=128, num_kv_heads=2, head_size=64, dtype=torch.float32)
    return dataclasses.replace(spec, **changes) if changes else spec


def _construct(config, kv_cache_config=None):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from rclc.vllm.capture.connector import RCLCCaptureConnector

    return RCLCCaptureConnector(config, KVConnectorRole.SCHEDULER, kv_cache_config or _cache_config(_full()))


def test_supported_configuration_constructs(tiny_dir):
    connector = _construct(_config(tiny_dir))
    assert connector.get_num_new_matched_tokens(None, 0) == (0, False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"enable_prefix_caching": True}, "prefix caching"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
        ({"enforce_eager": False}, "eager"),
    ],
)
def test_engine_arguments_refused(tiny_dir, overrides, message):
    with pytest.raises(ValueError, match=message):
        _construct(_config(tiny_dir, **overrides))


@pytest.mark.parametrize(
    ("section", "field", "value", "message"),
    [
        ("parallel_config", "tensor_parallel_size", 2, "tensor_parallel_size=2"),
        ("parallel_config", "pipeline_parallel_size", 2, "pipeline_parallel_size=2"),
        ("model_config", "quantization", "fp8", "quantized weights"),
        ("parallel_config", "data_parallel_size", 2, "data_parallel_size=2"),
        ("model_config.hf_config", "model_type", "gemma2", "model family 'gemma2' is unsupported"),
        ("", "speculative_config", object(), "speculative decoding is unsupported"),
    ],
)
def test_parallel_and_quantized_configurations_refused(tiny_dir, section, field, value, message):
    # These cannot be built on a one-CPU machine; change the built config's field instead.
    config = _config(tiny_dir)
    part = config
    for name in filter(None, section.split(".")):
        part = getattr(part, name)
    object.__setattr__(part, field, value)
    with pytest.raises(ValueError, match=message):
        _construct(config)


def test_sliding_window_model_refused(tiny_dir):
    config = _config(tiny_dir)
    object.__setattr__(config.model_config.hf_text_config, "sliding_window", 64)
    with pytest.raises(ValueError, match="sliding-window"):
        _construct(config)


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        (lambda: _cache_config(_full(), _full()), "2 KV cache groups"),
        (lambda: _cache_config(_full(sliding_window=32)), "sliding-window"),
        (lambda: _cache_config(_sliding()), "SlidingWindowSpec"),
    ],
)
def test_cache_groups_refused(tiny_dir, cache, message):
    with pytest.raises(ValueError, match=message):
        _construct(_config(tiny_dir), cache())


def _sliding():
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(block_size=128, num_kv_heads=2, head_size=64, dtype=torch.float32, sliding_window=32)


def test_multiprocessing_engine_refused(tiny_dir, monkeypatch):
    config = _config(tiny_dir)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        _construct(config)


def test_refusal_reaches_engine_construction(tiny_dir):
    with pytest.raises(ValueError, match="prefix caching"):
        vllm.LLM(**engine_arguments(tiny_dir, enable_prefix_caching=True))


def test_binding_check_reports_an_engine_without_capture(tiny_dir):
    with running_engine(tiny_dir, kv_transfer_config=None, enable_prompt_embeds=False) as llm:
        problems = check_engine(llm)
        assert any("capture is not enabled" in p for p in problems)
        assert any("enable_prompt_embeds=True" in p for p in problems)
        # The shared-weight view itself needs no connector: it only reads weights.
        view = model_from_vllm(llm)
        assert type(view).__name__ == "LlamaForCausalLM"


def test_connector_names_are_checked(tiny_dir):
    from vllm.config.kv_transfer import KVTransferConfig

    config = _config(tiny_dir)
    wrong = KVTransferConfig(**{**CONNECTOR, "kv_role": "kv_producer"})
    object.__setattr__(config, "kv_transfer_config", wrong)
    from rclc.vllm.capture.engine_checks import connector_problems

    assert any("kv_role" in p for p in connector_problems(config))


# A multiprocessing engine cannot be built in this process once an in-process engine has
# run (vLLM caches its environment variables then), so a fresh interpreter builds it.
_MULTIPROCESS_SCRIPT = '''
import os
import sys


def main(path):
    from tests.helpers.vllm_engines import engine_arguments, shutdown

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    import vllm

    import rclc

    try:
        vllm.LLM(**engine_arguments(path))
    except Exception as error:
        print("CONSTRUCTION-REFUSED", type(error).__name__, flush=True)
    llm = vllm.LLM(**engine_arguments(path, kv_transfer_config=None))
    try:
        rclc.bind(llm, backend="vllm")
    except Exception as error:
        print("BINDING-REFUSED", type(error).__name__, error, flush=True)
    finally:
        shutdown(llm)


if __name__ == "__main__":
    main(sys.argv[1])
'''


def test_multiprocessing_engine_refused_at_construction_and_binding(tiny_dir, tmp_path):
    """With the connector the engine never starts; without it, binding raises UnsupportedModelError."""
    import os
    import subprocess
    import sys

    script = tmp_path / "multiprocess_engine.py"
    script.write_text(_MULTIPROCESS_SCRIPT)
    environment = dict(os.environ, VLLM_CONFIGURE_LOGGING="0")
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_dir)], capture_output=True, text=True, env=environment, timeout=540
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # vLLM wraps the engine process's failure; the connector's own refusal is in its log.
    assert "CONSTRUCTION-REFUSED" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "UnsupportedModelError: RCLCCaptureConnector: the engine runs in a separate process" in done.stderr
    binding = [line for line in done.stdout.splitlines() if line.startswith("BINDING-REFUSED")]
    assert binding, done.stdout + done.stderr[-3000:]
    assert binding[0].startswith("BINDING-REFUSED UnsupportedModelError llm: ")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in binding[0]
