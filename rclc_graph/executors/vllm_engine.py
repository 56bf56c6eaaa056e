"""Graph models with `backend: vllm`: the pool's engine loader.

The pool loads one in-process vLLM engine configured for rclc (eager, no prefix caching,
prompt embeddings on, the capture connector: `rclc.vllm.kv_transfer_config()`) and hands
out the engine and its tokenizer; agents bind it with `backend="vllm"`, and a generating
node's `Agent.generate` then runs `llm.generate` where an HF node runs `model.generate`
(rclc's vLLM backend: tokens are reported once generation returns, and a generation runs
to its end). vLLM keeps one capture connector per process, so a process holds at most one
engine.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import rclc
from rclc.models import EMBEDDED_NAME, local_dir, transformers_names

from .loaded_model import LoadedModel, ModelKey
from ..errors import UsageError

MULTIPROCESSING_VARIABLE = "VLLM_ENABLE_V1_MULTIPROCESSING"
MINIMUM_KV_CACHE_BYTES = 64 * 2**20
# Room for this many full-length sequences in the KV pool: one user generation or capture
# runs at a time (the transfer core's locks), plus headroom for a preempted one.
KV_CACHE_SEQUENCES = 2
BLOCK_SLACK = 256  # positions: partial blocks at both ends of a sequence

_engine_lock = threading.Lock()
_engine: tuple[ModelKey, weakref.ref] | None = None


def _bytes_per_position(config: Any, dtype: str) -> int:
    import torch  # lazy: importing this module must not load torch (the pool imports it)

    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return int(config.num_hidden_layers) * 2 * kv_heads * head_dim * size


def engine_arguments(path: str, dtype: str) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments for `path`: the configuration the rclc adapter supports.

    The context is the checkpoint's own `max_position_embeddings`; the KV pool is sized for
    a few sequences of that length (vLLM's VLLM_CPU_KVCACHE_SPACE, in GiB, overrides it).
    """
    (AutoConfig,) = transformers_names("AutoConfig")  # lazy (transformers imports torch), under rclc's import lock

    config = AutoConfig.from_pretrained(path)
    max_model_len = int(config.max_position_embeddings)
    kv_bytes = KV_CACHE_SEQUENCES * (max_model_len + BLOCK_SLACK) * _bytes_per_position(config, dtype)
    return {
        "model": path,
        "dtype": dtype,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "enable_prompt_embeds": True,
        "max_model_len": max_model_len,
        "kv_cache_memory_bytes": max(MINIMUM_KV_CACHE_BYTES, kv_bytes),
        "kv_transfer_config": rclc.vllm.kv_transfer_config(),
    }


def _require_in_process() -> None:
    setting = os.environ.setdefault(MULTIPROCESSING_VARIABLE, "0")
    if setting != "0":
        raise UsageError(
            f"backend: vllm needs the engine in this process, but {MULTIPROCESSING_VARIABLE}={setting!r}; "
            f"unset it or export {MULTIPROCESSING_VARIABLE}=0"
        )


@dataclass
class VLLMLoadedModel(LoadedModel):
    """A pool entry whose `model` is a `vllm.LLM`; its identity is the shared-weight view's."""

    @property
    def fingerprint(self) -> str:
        with self._lock:
            if self._fingerprint is None:
                self._fingerprint = rclc.model_identity(rclc.vllm.shared_view(self.model), self.tokenizer)
            return self._fingerprint


def load_model(key: ModelKey) -> VLLMLoadedModel:
    """Start the process's vLLM engine for `key` (ValueError if another engine is alive)."""
    global _engine
    _require_in_process()
    path = str(local_dir(EMBEDDED_NAME)) if key.source == EMBEDDED_NAME else key.source
    with _engine_lock:
        if _engine is not None and _engine[1]() is not None:
            raise UsageError(
                f"backend: vllm: an engine for {_engine[0].source!r} is already running in this process and vLLM "
                "allows one capture engine per process; give every vllm model in the graph the same source and "
                "dtype, or use backend: hf for the others"
            )
        import vllm  # lazy: vLLM is an optional extra

        llm = vllm.LLM(**engine_arguments(path, key.dtype))
        _engine = (key, weakref.ref(llm))
    return VLLMLoadedModel(key, llm, rclc.vllm.engine_tokenizer(llm))


def shutdown(loaded: LoadedModel) -> None:
    """Stop a pool entry's engine so another one can start in this process."""
    global _engine
    core = getattr(getattr(loaded.model, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    with _engine_lock:
        if _engine is not None and _engine[1]() is loaded.model:
            _engine = None
