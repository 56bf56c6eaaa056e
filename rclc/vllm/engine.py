"""Reaching into an in-process vLLM engine, and checking it is one the adapter supports.

The adapter needs three things from an engine: its configuration, its model runner (for
the resident weights) and its request loop (for capture prefills). All of them are only
reachable in the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0); these helpers
find them and say what to change when they cannot.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import EngineBusyError, UnsupportedModelError
from .submission import existing_loop

from .capture.engine_checks import (
    CONNECTOR_NAMES,
    cache_group_problems,
    check_version,
    config_problems,
    connector_problems,
)


def _engine(llm: Any) -> Any:
    engine = getattr(llm, "llm_engine", None)
    if engine is None or not hasattr(engine, "vllm_config"):
        raise UnsupportedModelError(f"llm: expected a vllm.LLM (with .llm_engine), got {type(llm).__name__}")
    return engine


def vllm_config(llm: Any) -> Any:
    return _engine(llm).vllm_config


def engine_core(llm: Any) -> Any:
    """The in-process EngineCore; RuntimeError when the engine runs in another process."""
    client = _engine(llm).engine_core
    core = getattr(client, "engine_core", None)
    if core is None or not hasattr(core, "scheduler") or not hasattr(core, "model_executor"):
        raise RuntimeError(
            "the vLLM engine runs in a separate process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating "
            "the LLM so rclc can read its weights and KV pages"
        )
    return core


def model_runner(llm: Any) -> Any:
    """The worker's model runner (holds the resident model and the KV cache pool)."""
    executor = engine_core(llm).model_executor
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        raise RuntimeError(
            "cannot reach the vLLM model runner; use an in-process single-worker engine "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor_parallel_size=1)"
        )
    return runner


def engine_model(llm: Any) -> torch.nn.Module:
    """The engine's resident model module (vLLM's own class, not an HF one)."""
    runner = model_runner(llm)
    get_model = getattr(runner, "get_model", None)
    model = get_model() if callable(get_model) else getattr(runner, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise RuntimeError("the vLLM model runner holds no loaded model")
    return model


def require_idle(llm: Any) -> None:
    """EngineBusyError (a RuntimeError) unless every unfinished request of the engine is
    one rclc's submission loop added (`rclc.vllm.submission`).

    Capture prefills, the shared-weight view's side passes and re-prefills all use the
    engine's weights and request loop; they must not interleave with requests of a user's
    own loop. rclc's own requests of other agents are not "busy": they share the loop.
    """
    engine = _engine(llm)
    loop = existing_loop(llm)
    busy = loop.foreign_requests() > 0 if loop is not None else engine.has_unfinished_requests()
    if busy:
        raise EngineBusyError(
            "the vLLM engine has unfinished requests; finish or abort them before binding, transferring or updating"
        )


def engine_context_limit(llm: Any) -> int:
    """The engine's max_model_len: every prompt plus its output must fit below it."""
    return int(_engine(llm).model_config.max_model_len)


def engine_tokenizer(llm: Any) -> Any:
    """The engine's own tokenizer (agents bound to the engine render and decode with it)."""
    tokenizer = _engine(llm).get_tokenizer()
    if tokenizer is None:
        raise UnsupportedModelError(
            "llm: the engine was created with skip_tokenizer_init=True; rclc needs its tokenizer"
        )
    return tokenizer


def check_engine(llm: Any, *, allow_unstable: bool = False) -> list[str]:
    """Every reason `llm` cannot back an rclc agent, as sentences that say the fix (empty when fine)."""
    problems: list[str] = []
    try:
        check_version(allow_unstable=allow_unstable)
    except RuntimeError as error:
        problems.append(str(error))
    config = vllm_config(llm)
    problems += config_problems(config, check_environment=False)
    problems += connector_problems(config)
    model_config = config.model_config
    if not getattr(model_config, "enable_prompt_embeds", False):
        problems.append("prompt embeddings are disabled; create the engine with enable_prompt_embeds=True")
    dtype = getattr(model_config, "dtype", None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        problems.append(f"engine dtype {dtype!r} is not a floating dtype")
    try:
        core = engine_core(llm)
    except RuntimeError as error:
        problems.append(str(error))
        return problems
    scheduler = core.scheduler
    problems += cache_group_problems(getattr(scheduler, "kv_cache_config", None))
    connector = getattr(scheduler, "connector", None)
    if connector is not None and type(connector).__name__ not in CONNECTOR_NAMES:
        problems.append(f"the engine's scheduler uses connector {type(connector).__name__}, not RCLCCaptureConnector")
    try:
        model_runner(llm)
    except RuntimeError as error:
        problems.append(str(error))
    return list(dict.fromkeys(problems))
