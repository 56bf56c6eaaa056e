"""Model loading and sharing: one loaded model per distinct model declaration, per process.

Every node whose agent names a model gets the same (model, tokenizer) object, and so do
concurrent runs in the same process; the transfer core batches their generations on it
(`rclc.Batching`: a declaration's `batching:` options, or `max_batch` set on the pool by
`--max-batch`, are applied to the model whenever the pool hands it out, so the options of
the declaration used last are in force). The pool never downloads weights by itself:
`embedded` and local paths load offline, hub ids only where a hub is reachable.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rclc
from rclc.models import EMBEDDED_NAME, load, local_dir, transformers_names

from ..spec.models import ModelSpec
from . import openai_model, vllm_engine
from .loaded_model import LoadedModel, ModelKey, model_key
from ..errors import UsageError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelProfile:
    """What checks before a run need of a model: its tokenizer and its position limit.

    Read from the checkpoint's tokenizer and config files, without loading weights, so a
    prompt that cannot fit is refused before any model work (see run/preflight.py).
    """

    tokenizer: Any
    context_limit: int


class ModelPool:
    """Loads each distinct model once and hands the same objects to every caller (thread-safe)."""

    def __init__(self) -> None:
        self._models: dict[ModelKey, LoadedModel] = {}
        self._profiles: dict[ModelKey, ModelProfile] = {}
        self._lock = threading.Lock()
        self._batching: dict[ModelKey, dict[str, Any]] = {}  # options last applied to each model
        self.max_batch: int | None = None  # --max-batch: overrides every declaration's max_batch
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
        # lazy, under rclc's import lock: transformers imports torch, which `import rclc_graph`
        # must not load, and two threads must not import it for the first time at once
        AutoConfig, AutoTokenizer = transformers_names("AutoConfig", "AutoTokenizer")

        path = str(local_dir(key.source)) if key.source == EMBEDDED_NAME else key.source
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise UsageError(
                f"model source {key.source!r}: cannot read its tokenizer and config ({error}); "
                "give a local checkpoint directory or 'embedded'"
            ) from None
        limit = getattr(config, "max_position_embeddings", None)
        if not isinstance(limit, int) or limit < 1:
            raise UsageError(f"model source {key.source!r}: its config has no max_position_embeddings")
        return ModelProfile(tokenizer, limit)

    def get(self, spec: ModelSpec, base_dir: Path | None = None) -> LoadedModel:
        """The loaded model `spec` declares, loading it on first use (once per process)."""
        key = model_key(spec, base_dir)
        with self._lock:
            loaded = self._models.get(key)
            if loaded is None:
                loaded = self._load(key)
                self._models[key] = loaded
                self.loads += 1
            self._apply_batching(spec, loaded)
            return loaded

    def set_max_batch(self, max_batch: int | None) -> None:
        """Decode at most `max_batch` sequences together on every model of this pool (None:
        each declaration's own `batching.max_batch`, else rclc's default)."""
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise UsageError(f"max_batch: expected an int >= 1 or None, got {max_batch!r}")
        with self._lock:
            self.max_batch = max_batch
            self._batching.clear()  # re-applied on the next get of each model

    def _apply_batching(self, spec: ModelSpec, loaded: LoadedModel) -> None:
        """Apply `spec.batching` (and the pool's max_batch) to the loaded model when they changed.
        An API model has no local forwards to batch (its server batches), so it is left alone."""
        if spec.is_api:
            return
        changes: dict[str, Any] = {} if spec.batching is None else spec.batching.model_dump()
        if self.max_batch is not None:
            changes["max_batch"] = self.max_batch
        if changes and self._batching.get(loaded.key) != changes:
            rclc.configure_batching(loaded.model, **changes)
            self._batching[loaded.key] = changes

    def add(self, spec: ModelSpec, model: Any, tokenizer: Any, base_dir: Path | None = None) -> LoadedModel:
        """Register an already loaded model under `spec` (tests, notebooks, tiny models)."""
        key = model_key(spec, base_dir)
        with self._lock:
            loaded = LoadedModel(key, model, tokenizer)
            self._models[key] = loaded
            self._batching.pop(key, None)
            self._apply_batching(spec, loaded)
            return loaded

    def loaded(self) -> list[LoadedModel]:
        """Every model loaded so far (records name their fingerprints)."""
        with self._lock:
            return list(self._models.values())

    @staticmethod
    def _load(key: ModelKey) -> LoadedModel:
        logger.info("loading model %s (%s, %s on %s)", key.source, key.backend, key.dtype, key.device)
        if key.backend == "openai":
            return openai_model.load_model(key)
        if key.backend == "vllm":
            return vllm_engine.load_model(key)
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
