"""Model loading and sharing: one loaded model per distinct model declaration, per process.

Every node whose agent names a model gets the same (model, tokenizer) object, and so do
concurrent runs in the same process; the transfer core serialises model work on it. The
pool never downloads weights by itself: `embedded` and local paths load offline, hub ids
only where a hub is reachable.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spec import ModelSpec


@dataclass(frozen=True)
class ModelKey:
    source: str
    dtype: str
    device: str
    backend: str


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
        """SHA-256 identity of weights, forward configuration and vocabulary (rclc.snapshot)."""
        with self._lock:
            if self._fingerprint is None:
                from rclc.snapshot import model_identity

                self._fingerprint = model_identity(self.model, self.tokenizer)
            return self._fingerprint


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def model_key(spec: ModelSpec, base_dir: Path | None = None) -> ModelKey:
    source = spec.source
    if spec.source_kind == "path":
        path = Path(source).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        source = str(path.resolve())
    device = _resolve_device(spec.device)
    return ModelKey(source, _resolve_dtype(spec.dtype, device), device, spec.backend)


@dataclass(frozen=True)
class ModelProfile:
    """What checks before a run need of a model: its tokenizer and its position limit.

    Read from the checkpoint's tokenizer and config files, without loading weights, so a
    prompt that cannot fit is refused before any model work (see preflight.py).
    """

    tokenizer: Any
    context_limit: int


class ModelPool:
    """Loads each distinct model once and hands the same objects to every caller (thread-safe)."""

    def __init__(self) -> None:
        self._models: dict[ModelKey, LoadedModel] = {}
        self._profiles: dict[ModelKey, ModelProfile] = {}
        self._lock = threading.Lock()
        self.loads = 0  # how many models were actually loaded (tests and records read it)

    def profile(self, spec: ModelSpec, base_dir: Path | None = None) -> ModelProfile:
        """Tokenizer and context limit of `spec`: from the loaded model when there is one,
        else from its tokenizer and config files alone (weights are not read)."""
        key = model_key(spec, base_dir)
        with self._lock:
            loaded = self._models.get(key)
            if loaded is not None:
                return ModelProfile(loaded.tokenizer, int(loaded.model.config.max_position_embeddings))
            known = self._profiles.get(key)
        if known is not None:
            return known
        profile = self._read_profile(key)
        with self._lock:
            return self._profiles.setdefault(key, profile)

    @staticmethod
    def _read_profile(key: ModelKey) -> ModelProfile:
        from rclc.models import EMBEDDED_NAME, local_dir
        from transformers import AutoConfig, AutoTokenizer

        path = str(local_dir(key.source)) if key.source == EMBEDDED_NAME else key.source
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"model source {key.source!r}: cannot read its tokenizer and config ({error}); "
                "give a local checkpoint directory or 'embedded'"
            ) from None
        limit = getattr(config, "max_position_embeddings", None)
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"model source {key.source!r}: its config has no max_position_embeddings")
        return ModelProfile(tokenizer, limit)

    def get(self, spec: ModelSpec, base_dir: Path | None = None) -> LoadedModel:
        key = model_key(spec, base_dir)
        with self._lock:
            loaded = self._models.get(key)
            if loaded is None:
                loaded = self._load(key)
                self._models[key] = loaded
                self.loads += 1
            return loaded

    def add(self, spec: ModelSpec, model: Any, tokenizer: Any, base_dir: Path | None = None) -> LoadedModel:
        """Register an already loaded model under `spec` (tests, notebooks, tiny models)."""
        key = model_key(spec, base_dir)
        with self._lock:
            loaded = LoadedModel(key, model, tokenizer)
            self._models[key] = loaded
            return loaded

    def loaded(self) -> list[LoadedModel]:
        with self._lock:
            return list(self._models.values())

    @staticmethod
    def _load(key: ModelKey) -> LoadedModel:
        if key.backend == "vllm":
            from .vllm_runtime import load_model

            return load_model(key)
        from rclc.models import load

        model, tokenizer = load(key.source, dtype=key.dtype, device=key.device)
        return LoadedModel(key, model, tokenizer)


_default_pool: ModelPool | None = None
_default_lock = threading.Lock()


def default_pool() -> ModelPool:
    """The process-wide pool, so separate runs in one process share their models."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = ModelPool()
        return _default_pool
