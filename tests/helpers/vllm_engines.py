"""In-process CPU engines with the capture connector, for the vLLM tests.

Engines are slow to start, so each test module shares one engine (module-scoped
fixtures) and shuts it down afterwards: vLLM keeps the worker-side connector in a
process global until the engine shuts down, so two live engines would share it.
"""

from __future__ import annotations

import contextlib
import gc
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import vllm  # noqa: E402

from rclc import testing  # noqa: E402

CONNECTOR = {
    "kv_connector": "RCLCCaptureConnector",
    "kv_connector_module_path": "rclc.vllm.capture.connector",
    "kv_role": "kv_both",
}


def engine_arguments(path: str, **overrides) -> dict:
    """The supported configuration (float32, eager, no prefix caching, capture on)."""
    arguments = dict(
        model=str(path),
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        enable_prompt_embeds=True,
        max_model_len=512,
        kv_cache_memory_bytes=64 * 2**20,
        kv_transfer_config=dict(CONNECTOR),
    )
    arguments.update(overrides)
    return arguments


def shutdown(llm) -> None:
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    gc.collect()


@contextlib.contextmanager
def running_engine(path, **overrides):
    llm = vllm.LLM(**engine_arguments(path, **overrides))
    try:
        yield llm
    finally:
        shutdown(llm)


def save_tiny(directory, family: str = "llama", **kwargs):
    """A tiny random model vLLM's CPU kernels accept (head size 64), saved as safetensors."""
    kwargs.setdefault("head_dim", 64)
    if family == "qwen2":  # vLLM's Qwen2 derives head_dim from hidden_size / heads
        kwargs.setdefault("hidden_size", 4 * kwargs["head_dim"])
    model, tokenizer = testing.tiny_model(family, **kwargs)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return model, tokenizer
