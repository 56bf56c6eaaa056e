"""Batching options and figures per model: `rclc.configure_batching`, `rclc.batching_report`.

Both backends batch concurrent generations on one model by default: an HF model through
its batching engine (`hf_batching.py`), a vLLM engine through its submission loop
(`rclc.vllm.submission`), where vLLM's own scheduler batches. These two functions set the
options (`rclc.Batching`) and read what happened, whichever backend the model is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._flat_combining import parallel_forwards
from .._locks import set_forward_width
from .._shared_prefill import PrefillOptions, existing_shared_prefill, shared_prefill
from ..errors import RclcError
from ..generation import Batching
from ..selectors._shared_capture import existing_shared_capture, shared_capture
from .hf_batching import engine_for, existing_engine


def _is_vllm(model: Any) -> bool:
    return hasattr(model, "llm_engine")


def _resolve(model: Any) -> Any:
    """An HF model or a `vllm.LLM` (what agents are bound to)."""
    if not _is_vllm(model) and getattr(model, "config", None) is None:
        raise RclcError(
            f"model: expected a loaded HF model or a vllm.LLM (what agents are bound to), got {type(model).__name__}"
        )
    return model


def configure_batching(model: Any, batching: Batching | None = None, **changes: Any) -> Batching:
    """Set how concurrent generations on `model` share its forwards; returns the options now in force.

    Pass a `Batching`, or keyword changes to the current options
    (`configure_batching(model, max_batch=8)`); they apply from the next decode step on.
    """
    if batching is not None and not isinstance(batching, Batching):
        raise RclcError(f"batching: expected rclc.Batching or None, got {type(batching).__name__}")
    target = _resolve(model)
    if _is_vllm(target):
        from ..vllm.submission import engine_loop  # vLLM's adapter: only for an engine

        runner: Any = engine_loop(target)
    else:
        runner = engine_for(target)
    current = batching if batching is not None else runner.batching
    if changes:
        options = [option.name for option in dataclasses.fields(Batching)]
        unknown = sorted(set(changes) - set(options))
        if unknown:
            raise RclcError(
                f"{unknown[0]}: not a batching option; use {', '.join(options[:-1])} or {options[-1]}"
            )
        current = Batching(**{**current.to_dict(), **changes})
    runner.configure(current)
    if not _is_vllm(target):
        set_forward_width(target, current.worker_forwards)
        shared_prefill(target).configure(
            PrefillOptions(current.shared_prefixes, current.prefix_cache_mib, current.prefill_batch)
        )
        shared_capture(target).configure(current.capture_batch)
    return current


def batching_report(model: Any) -> dict[str, Any]:
    """Options and figures of `model`'s batching as plain data: decode steps per batch size
    (`batch_sizes`), their mean, sequences and tokens decoded, and what runs now."""
    target = _resolve(model)
    if _is_vllm(target):
        from ..vllm.submission import existing_loop  # vLLM's adapter: only for an engine

        runner: Any = existing_loop(target)
        backend = "vllm"
    else:
        runner = existing_engine(target)
        backend = "hf"
    if runner is None:
        report = {**Batching().to_dict(), "backend": backend, "running": False, "active": 0, "waiting": 0,
                  "sequences": 0, "decode_steps": 0, "batch_sizes": {}, "mean_batch": 0.0}
    else:
        report = runner.report()
    if backend == "hf":
        # Whether two slot holders that gather at once share the waiting prompts and captures
        # out and forward side by side (True), or the first serves them all (rclc._flat_combining).
        report["parallel_forwards"] = parallel_forwards(target)
        prefills = existing_shared_prefill(target)
        report["prompt_prefills"] = prefills.report() if prefills is not None else None
        captures = existing_shared_capture(target)
        report["request_captures"] = captures.report() if captures is not None else None
    return report
