"""Graph models with `backend: vllm`: the pool's engine loader and the nodes' native generation.

The pool loads one in-process vLLM engine configured for rclc (eager, no prefix caching,
prompt embeddings on, the capture connector) and hands out the engine and its tokenizer;
agents bind it with `backend="vllm"`. A generating node runs `llm.generate` where an HF
node runs `model.generate`:

- with deliveries, from the prompt embeddings `agent.pop()` returns, recorded with
  `agent.update(inputs=..., generation=...)` (a re-prefill of prefix + completion);
- without (a root), from the prompt's token IDs, recorded by binding the complete prompt
  and output IDs (`agent.update(ids)`, one capture).

vLLM gives no per-token callback through `llm.generate`, so token events are published
after generation, and a cancelled run stops once the current generation returns.
vLLM keeps one capture connector per process, so a process holds at most one engine.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import anyio

from ..plan.compile import PlanNode
from .contract import RunContext
from .loaded_model import LoadedModel, ModelKey

CONNECTOR = {
    "kv_connector": "RCLCCaptureConnector",
    "kv_connector_module_path": "rclc.vllm.capture.connector",
    "kv_role": "kv_both",
}
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
    from transformers import AutoConfig  # lazy: transformers imports torch

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
        "kv_transfer_config": dict(CONNECTOR),
    }


def _require_in_process() -> None:
    setting = os.environ.setdefault(MULTIPROCESSING_VARIABLE, "0")
    if setting != "0":
        raise ValueError(
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
                # lazy: rclc imports torch, rclc.vllm imports vLLM (an optional extra); phase 2 hoists rclc.snapshot
                from rclc.snapshot import model_identity
                from rclc.vllm import shared_view

                self._fingerprint = model_identity(shared_view(self.model), self.tokenizer)
            return self._fingerprint


def load_model(key: ModelKey) -> VLLMLoadedModel:
    """Start the process's vLLM engine for `key` (ValueError if another engine is alive)."""
    global _engine
    _require_in_process()
    from rclc.models import EMBEDDED_NAME, local_dir  # lazy: rclc imports torch; phase 2 hoists it

    path = str(local_dir(EMBEDDED_NAME)) if key.source == EMBEDDED_NAME else key.source
    with _engine_lock:
        if _engine is not None and _engine[1]() is not None:
            raise ValueError(
                f"backend: vllm: an engine for {_engine[0].source!r} is already running in this process and vLLM "
                "allows one capture engine per process; give every vllm model in the graph the same source and "
                "dtype, or use backend: hf for the others"
            )
        import vllm  # lazy: vLLM is an optional extra

        from rclc.vllm import engine_tokenizer  # lazy: imports vLLM

        llm = vllm.LLM(**engine_arguments(path, key.dtype))
        _engine = (key, weakref.ref(llm))
    return VLLMLoadedModel(key, llm, engine_tokenizer(llm))


def shutdown(loaded: LoadedModel) -> None:
    """Stop a pool entry's engine so another one can start in this process."""
    global _engine
    core = getattr(getattr(loaded.model, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    with _engine_lock:
        if _engine is not None and _engine[1]() is loaded.model:
            _engine = None


# -- generation ----------------------------------------------------------------------------


def sampling_params(spec: Any, max_tokens: int, seed: int) -> Any:
    """The agent spec's decoding as vLLM sampling: greedy is temperature 0."""
    import vllm  # lazy: vLLM is an optional extra

    if spec.greedy:
        return vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    options: dict[str, Any] = {"temperature": spec.temperature, "seed": seed}
    if spec.top_p is not None:
        options["top_p"] = spec.top_p
    return vllm.SamplingParams(max_tokens=max_tokens, **options)


def _generate(llm: Any, inputs: dict[str, Any]) -> Any:
    """`llm.generate(**inputs)` with every other rclc model pass on this engine held off.

    The shared-weight view's side passes and capture prefills need an idle engine; holding
    both core locks (in their fixed order) makes them wait rather than fail.
    """
    # lazy: rclc imports torch and rclc.vllm imports vLLM; phase 2 replaces rclc._locks with public API
    from rclc._locks import attention_lock, preparation_lock
    from rclc.vllm import require_idle

    with preparation_lock, attention_lock:
        require_idle(llm)
        return llm.generate(**inputs)


async def finish_with_vllm(
    ctx: RunContext, node: PlanNode, agent: Any, prompt_text: str, deliveries: int, seed: int
) -> tuple[int, float, str]:
    """Generate for a node bound to a vLLM engine and record the continuation in its agent.

    Returns (generated tokens, generation seconds, text), like the HF path.
    """
    import torch  # lazy: importing this module must not load torch

    from rclc._worker import run_in_worker  # lazy: rclc imports torch; phase 2 uses rclc.run_in_worker

    llm, tokenizer, spec = agent.engine, agent.tokenizer, node.agent
    limit = llm.llm_engine.model_config.max_model_len
    if deliveries:
        inputs = agent.pop(prompt=prompt_text, deliveries=deliveries)
        prompt_length = int(inputs["prompts"]["prompt_embeds"].shape[0])
        cap = inputs["sampling_params"].max_tokens
        ids = None
    else:
        ids = tokenizer(prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        prompt_length, cap = int(ids.shape[0]), spec.max_new_tokens
        inputs = {"prompts": {"prompt_token_ids": ids.tolist()}, "use_tqdm": False}
    # The continuation is recorded by a re-prefill, which needs one position to spare.
    cap = min(cap, limit - prompt_length - 1)
    if cap < 1:
        raise ValueError(
            f"context space: the prompt holds {prompt_length} positions; the engine's limit {limit} leaves no room "
            "to generate and record a continuation"
        )
    inputs["sampling_params"] = sampling_params(spec, cap, seed)
    began = time.perf_counter()
    output = await run_in_worker(_generate, llm, inputs)
    seconds = time.perf_counter() - began
    if ctx.stop.is_set():
        raise anyio.get_cancelled_exc_class()()
    generated = list(output[0].outputs[0].token_ids)
    if ids is None:
        await run_in_worker(lambda: agent.update(inputs=inputs, generation=output))
    else:
        full = torch.cat([ids, torch.tensor(generated, dtype=torch.int64)])[None]
        await run_in_worker(agent.update, full)
    for index, token in enumerate(generated):
        piece = tokenizer.decode([token], skip_special_tokens=False)
        await ctx.publish("token", {"node": node.name, "index": index, "text": piece})
    text = tokenizer.decode(generated, skip_special_tokens=True).strip()
    return len(generated), seconds, text
