"""Model work behind a bound agent: the contract (`Backend`) and its HF and vLLM implementations.

`open_backend` picks the implementation for an agent's `backend=` name. The vLLM one
imports no vLLM until an engine is bound (vLLM is an optional extra). Concurrent native
generations on one model are batched (`configure_batching`, `batching_report`).
"""

from __future__ import annotations

from typing import Any

from ..errors import RclcError
from ..policy import BACKENDS
from .batching import batching_report, configure_batching
from .contract import Backend, NativeGeneration, TokenCallback
from .hf import HFBackend
from .vllm import VLLMBackend

__all__ = [
    "BACKENDS",
    "Backend",
    "HFBackend",
    "NativeGeneration",
    "TokenCallback",
    "VLLMBackend",
    "batching_report",
    "configure_batching",
    "open_backend",
]


def open_backend(name: str, model: Any, tokenizer: Any, *, allow_unstable: bool) -> Backend:
    """The backend called `name` over `model` (an HF model, or a `vllm.LLM` for "vllm")."""
    if name == "vllm":
        return VLLMBackend(model, tokenizer, allow_unstable=allow_unstable)
    if name == "hf":
        return HFBackend(model, tokenizer)
    raise RclcError(f"backend: {name!r} is not one of {BACKENDS}")
