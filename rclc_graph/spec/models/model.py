"""Model declarations: which weights (or which OpenAI-compatible server), where they run, and
how concurrent generations share them."""

from __future__ import annotations

import re
from typing import Annotated, Callable, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationInfo, field_validator, model_validator

from rclc.policy import (
    BACKENDS,
    DEFAULT_CAPTURE_BATCH,
    DEFAULT_MAX_BATCH,
    DEFAULT_PREFILL_BATCH,
    DEFAULT_PREFIX_CACHE_MIB,
    DEFAULT_PREFILL_FIRST_MS,
    DEFAULT_WAIT_MS,
    DEFAULT_WORKER_FORWARDS,
)

from .fields import Name, SpecBase, changed_fields, spec_error

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:[0-9]+)?)$")
_PATH_PREFIXES = ("/", "./", "../", "~")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HTTP_URL = re.compile(r"^https?://[^\s/?#]+(?:/[^\s?#]*)?$")

API_BACKEND = "openai"
"""The graph-level backend of models served over an OpenAI-compatible HTTP API: no rclc state."""
MODEL_BACKENDS = (*BACKENDS, API_BACKEND)
_API_FIELDS = ("base_url", "model", "api_key_env", "timeout", "max_retries")
_LOCAL_FIELDS = ("source", "dtype", "device", "batching")


_TEXT_CHECKS: dict[str, tuple[Callable[[str], object], str, str]] = {
    "source": (lambda value: source_kind(value) is not None, "source {value!r} is neither 'embedded', a path nor a hub id",
               "write 'embedded', a path starting with ./, ../, / or ~, or a hub id such as owner/name"),
    "device": (_DEVICE.match, "device {value!r} is not recognised", "use auto, cpu, mps, cuda or cuda:N"),
    "base_url": (_HTTP_URL.match, "base_url {value!r} is not an http(s) URL", "write e.g. http://127.0.0.1:8000/v1"),
    "api_key_env": (_ENV_NAME.match, "api_key_env {value!r} is not an environment variable name",
                    "name the variable that holds the key (e.g. OPENAI_API_KEY); never write the key itself in a file"),
}
"""The text fields of a model checked one by one: field -> (accepts, message, fix)."""


class BatchingSpec(SpecBase):
    """How concurrent generations on a model share its forwards (`rclc.Batching`)."""

    enabled: bool = Field(True, description="decode concurrent generations together (false: one at a time)")
    max_batch: PositiveInt = Field(DEFAULT_MAX_BATCH, description="sequences decoded together at most")
    wait_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        DEFAULT_WAIT_MS, description="how long a decode step with room waits for another sequence (ms)"
    )
    worker_forwards: PositiveInt = Field(
        DEFAULT_WORKER_FORWARDS,
        description="prefills, selectors' captures and refreshes the model runs at once, each in its caller's "
        "worker thread (hf models)",
    )
    shared_prefixes: bool = Field(
        True,
        description="reuse the KV of a prompt prefix the model prefilled before (same token IDs) instead of "
        "computing it again (hf models; false: every prompt prefilled whole)",
    )
    prefill_batch: PositiveInt = Field(
        DEFAULT_PREFILL_BATCH,
        description="prompts waiting together that one forward prefills at most (hf models; 1: each alone)",
    )
    prefix_cache_mib: NonNegativeInt = Field(
        DEFAULT_PREFIX_CACHE_MIB, description="memory the model's store of prompt prefixes may hold (MiB; hf models)"
    )
    prefill_first_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        DEFAULT_PREFILL_FIRST_MS,
        description="how long a decode step waits, at most, for prompts under or waiting for prefill that "
        "would at least double its batch to join it first (ms; hf models; 0: never)",
    )
    capture_batch: PositiveInt = Field(
        DEFAULT_CAPTURE_BATCH,
        description="transfers waiting together whose selectors' request captures one forward folds at most "
        "(hf models; 1: each transfer alone)",
    )


class ModelSpec(SpecBase):
    """A model, loaded once per process and shared by every node whose agent names it."""

    name: Name
    source: str = Field(
        "embedded",
        description="'embedded' (the bundled SmolLM2-135M-Instruct), a local path (starting with /, ./, ../ "
        "or ~; relative to the YAML file) or a hub id owner/name",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: str = Field("auto", description="auto, cpu, mps, cuda or cuda:N")
    backend: Literal[MODEL_BACKENDS] = "hf"  # type: ignore[valid-type]
    base_url: str | None = Field(
        None, description="backend openai: the server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1"
    )
    model: str | None = Field(None, description="backend openai: the model name the server serves")
    api_key_env: str | None = Field(
        None, description="backend openai: the NAME of an environment variable holding the API key (never the key)"
    )
    timeout: PositiveFloat = Field(60.0, description="backend openai: seconds one request may take")
    max_retries: NonNegativeInt = Field(
        2, le=10, description="backend openai: retries (with backoff) after a timeout, 408, 409, 429 or 5xx"
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="what each replica holds on Ray ({CPU: 1} by default, {GPU: 1}, custom resources); unused in-process",
    )
    replicas: PositiveInt = Field(
        1, description="Ray actors holding this model (executor ray); in-process runs use one copy"
    )
    batching: BatchingSpec | None = Field(
        None,
        description="how concurrent generations and prompts share this model (enabled, max_batch, wait_ms, "
        "worker_forwards, shared_prefixes, prefill_batch, prefix_cache_mib, capture_batch, prefill_first_ms); "
        "omitted: rclc's defaults, or what the process configured",
    )

    @field_validator(*_TEXT_CHECKS)
    @classmethod
    def _text_fields(cls, value: str | None, info: ValidationInfo) -> str | None:
        accepts, message, fix = _TEXT_CHECKS[str(info.field_name)]
        if value is not None and not accepts(value):
            raise spec_error("E_FIELD", message.format(value=value), fix)
        return value

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        for key, amount in value.items():
            if amount < 0:
                raise spec_error("E_FIELD", f"resources.{key} is negative ({amount})", "use an amount >= 0")
        return value

    @model_validator(mode="after")
    def _backend_fields(self) -> ModelSpec:
        if self.backend == API_BACKEND:
            missing = [name for name in ("base_url", "model") if getattr(self, name) is None]
            if missing:
                raise spec_error(
                    "E_FIELD",
                    f"backend openai needs {' and '.join(missing)}",
                    "set base_url (e.g. http://127.0.0.1:8000/v1) and model (the name the server serves)",
                )
            local = changed_fields(self, _LOCAL_FIELDS)
            if local:
                raise spec_error(
                    "E_FIELD",
                    f"backend openai does not use {', '.join(local)} (the server holds the weights)",
                    f"remove {', '.join(local)}",
                )
        else:
            api = changed_fields(self, _API_FIELDS)
            if api:
                raise spec_error(
                    "E_FIELD",
                    f"{', '.join(api)} apply to backend openai only",
                    f"set backend: openai, or remove {', '.join(api)}",
                )
        return self

    @property
    def is_api(self) -> bool:
        """Whether this model is served over an OpenAI-compatible API (no local weights, no state)."""
        return self.backend == API_BACKEND

    @property
    def source_kind(self) -> str:
        """"embedded", "path" or "hub": how the pool finds the weights."""
        return source_kind(self.source) or "hub"


def source_kind(source: str) -> str | None:
    """"embedded", "path", "hub", or None when `source` is none of them."""
    if source == "embedded":
        return "embedded"
    if source.startswith(_PATH_PREFIXES) or re.match(r"^[A-Za-z]:[\\/]", source):
        return "path"
    if _HUB_ID.match(source):
        return "hub"
    return None
