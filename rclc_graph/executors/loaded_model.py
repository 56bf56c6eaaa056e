"""Which model a declaration means, and a model once loaded.

`ModelKey` is what makes two model declarations the same model (source, dtype, device,
backend after resolving "auto"); `LoadedModel` is one loaded model with the identity records
need. Kept apart from the pool so the vLLM engine loader, which makes LoadedModels, and the
pool, which calls that loader, do not import each other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rclc

from ..spec.models import ModelSpec


@dataclass(frozen=True)
class ModelKey:
    source: str
    dtype: str
    device: str
    backend: str
    api_model: str | None = None  # backend openai: the served model's name (source is the base URL)


@dataclass
class LoadedModel:
    """A loaded model and what records need about it (fingerprint computed once, on demand)."""

    key: ModelKey
    model: Any
    tokenizer: Any
    _fingerprint: str | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def fingerprint(self) -> str:
        """SHA-256 identity of weights, forward configuration and vocabulary (`rclc.model_identity`)."""
        with self._lock:
            if self._fingerprint is None:
                self._fingerprint = rclc.model_identity(self.model, self.tokenizer)
            return self._fingerprint


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch  # lazy: planning and `import rclc_graph` must not load torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def model_key(spec: ModelSpec, base_dir: Path | None = None) -> ModelKey:
    if spec.is_api:  # a server, not weights: nothing to resolve (and no torch to ask about devices)
        return ModelKey(str(spec.base_url), "none", "remote", spec.backend, api_model=spec.model)
    source = spec.source
    if spec.source_kind == "path":
        path = Path(source).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        source = str(path.resolve())
    device = _resolve_device(spec.device)
    return ModelKey(source, _resolve_dtype(spec.dtype, device), device, spec.backend)
