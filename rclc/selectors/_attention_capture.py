"""Attention capture: run extra query rows over a private view of a sender's cache with the
model's own attention kernel, and hand each global layer's post-RoPE queries and full keys
to a `fold` callback.

Why a registry swap rather than hooks: the post-RoPE query and the key tensor *after* the
cache append only exist inside the attention call. Transformers dispatches that call by
name (`config._attn_implementation`) through `ALL_ATTENTION_FUNCTIONS`, and builds the
mask through `ALL_MASK_ATTENTION_FUNCTIONS` under the same name. We register one extra
name whose functions delegate to the original implementation with the same arguments, so
the model's outputs are exactly what they would have been, and the fold sees the tensors
in passing.

Switching: every config reachable from the model (module `config` attributes and their
sub-configs) gets its `_attn_implementation_internal` written directly and written back
afterwards by identity. `model.set_attn_implementation` would also work but re-validates
the implementation and walks every module on each call, and we need to restore the exact
previous values anyway (measured in benchmarks/selection_overhead.py: `switch_ms`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .._cache import cache_length, crop_cache, forward_rows, view_cache
from .._locks import attention_lock
from ..errors import CaptureError, RclcError
from ..models import CAPTURE_ATTENTION

CAPTURE_NAME = CAPTURE_ATTENTION  # models.check_model must recognise the swap

Fold = Callable[[torch.Tensor, torch.Tensor, float], None]

_registration_lock = threading.Lock()
_registered = False


@dataclass
class _ActiveCapture:
    """What the registered functions need while one capture runs (one at a time: attention lock)."""

    fold: Fold
    attention: Callable[..., Any] | None  # None: the model's own eager function, resolved per module
    mask: Callable[..., Any]
    keys_expected: int
    global_layers: frozenset[int]
    thread: int
    seen: set[int] = field(default_factory=set)


_active: _ActiveCapture | None = None


def _require_active() -> _ActiveCapture:
    active = _active
    if active is None:
        raise CaptureError(
            f"attention capture: a model is configured with {CAPTURE_NAME!r} outside a capture; "
            "its previous attention implementation was not restored (set model.config._attn_implementation back)"
        )
    return active


def _eager_attention(module: Any) -> Callable[..., Any]:
    function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if function is None:
        raise CaptureError(
            f"attention capture: {type(module).__name__} has no module-level eager_attention_forward to delegate to; "
            "load the model with attn_implementation='sdpa'"
        )
    return function


def _capture_attention(module: Any, query: torch.Tensor, key: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    active = _require_active()
    attention = active.attention if active.attention is not None else _eager_attention(module)
    output = attention(module, query, key, *args, **kwargs)[0]
    if threading.get_ident() != active.thread:
        # Someone else forwarding this model during our capture: serve them, fold nothing.
        return output, None
    layer = getattr(module, "layer_idx", None)
    active.seen.add(layer)
    if layer in active.global_layers:
        if key.shape[-2] != active.keys_expected:
            raise CaptureError(
                f"attention capture: layer {layer} saw {key.shape[-2]} keys, expected {active.keys_expected} "
                "(the cache copy was truncated or not extended)"
            )
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = getattr(module, "scaling", None)
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        active.fold(query, key, float(scaling))
    return output, None


def _capture_mask(*args: Any, **kwargs: Any) -> Any:
    return _require_active().mask(*args, **kwargs)


def _register() -> None:
    """Add the capture name to both registries (class-level, so every interface instance sees it)."""
    global _registered
    if _registered:
        return
    with _registration_lock:
        if not _registered:
            AttentionInterface.register(CAPTURE_NAME, _capture_attention)
            AttentionMaskInterface.register(CAPTURE_NAME, _capture_mask)
            _registered = True


def _delegates(implementation: str) -> tuple[Callable[..., Any] | None, Callable[..., Any]]:
    if implementation == CAPTURE_NAME:
        raise CaptureError("attention capture: captures cannot nest (the model is already being captured)")
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise CaptureError(
            f"attention capture: attention implementation {implementation!r} has no mask factory to delegate to; "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )
    mask = ALL_MASK_ATTENTION_FUNCTIONS[implementation]
    if implementation == "eager":
        return None, mask
    if implementation not in ALL_ATTENTION_FUNCTIONS:
        raise CaptureError(
            f"attention capture: attention implementation {implementation!r} is not registered; "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )
    return ALL_ATTENTION_FUNCTIONS[implementation], mask


def reachable_configs(model: Any) -> list[Any]:
    """Every distinct config object of the model, its modules and their sub-configs.

    Attention modules hold their own `config` reference (usually the model's object, but a
    composite model can hand different objects to different stacks), so all are switched.
    """
    found: dict[int, Any] = {}
    pending = [model.config]
    for module in model.modules():
        config = module.__dict__.get("config")  # plain attribute; avoids nn.Module.__getattr__
        if config is not None:
            pending.append(config)
    while pending:
        config = pending.pop()
        if not isinstance(config, PretrainedConfig) or id(config) in found:
            continue
        found[id(config)] = config
        for key in getattr(config, "sub_configs", None) or {}:
            sub = getattr(config, key, None)
            if sub is not None:
                pending.append(sub)
    return list(found.values())


def global_layers(config: Any) -> frozenset[int]:
    """Indices of full-attention layers (`layer_types` kinds without "sliding"/"chunked")."""
    count = int(config.num_hidden_layers)
    kinds = getattr(config, "layer_types", None) or ["full"] * count
    chosen = frozenset(i for i, kind in enumerate(kinds) if "sliding" not in str(kind) and "chunked" not in str(kind))
    if not chosen:
        raise CaptureError("attention capture: the model has no global (full-attention) layer to score")
    return chosen


def capture(
    model: Any,
    past: Any,
    fold: Fold,
    memory: int,
    *,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
) -> None:
    """Forward `input_ids [1, rows]` or `inputs_embeds [1, rows, hidden]` after the first
    `memory` cached positions of `past`, calling `fold(query [1, H, rows, d], key
    [1, K, memory + rows, d], scaling)` once per global layer.

    `past` is never written: the forward runs over a new cache object sharing its tensors,
    and DynamicCache appends by concatenation into fresh tensors. Attention dispatch is
    restored before this returns or raises (also when `fold` raises).
    """
    global _active
    if (input_ids is None) == (inputs_embeds is None):
        raise RclcError("capture: pass exactly one of input_ids or inputs_embeds")
    rows = int((input_ids if input_ids is not None else inputs_embeds).shape[1])
    config = model.config
    layers = global_layers(config)
    _register()
    with attention_lock:
        original = getattr(config, "_attn_implementation", None) or "sdpa"
        attention, mask = _delegates(original)
        private = view_cache(model, past) if cache_length(past) == memory else crop_cache(model, past, memory)
        if cache_length(private) != memory:
            raise CaptureError(
                f"attention capture: the cache holds {cache_length(past)} positions, fewer than the {memory} requested"
            )
        configs = reachable_configs(model)
        saved = [(c, getattr(c, "_attn_implementation_internal", None)) for c in configs]
        # A fold may itself capture another model (same thread, re-entrant lock): put the
        # outer capture back afterwards rather than clearing it.
        outer = _active
        active = _ActiveCapture(
            fold=fold,
            attention=attention,
            mask=mask,
            keys_expected=memory + rows,
            global_layers=layers,
            thread=threading.get_ident(),
        )
        _active = active
        try:
            for c in configs:
                c._attn_implementation_internal = CAPTURE_NAME
            if config._attn_implementation != CAPTURE_NAME:
                raise CaptureError("attention capture: the model refused the capture attention implementation")
            forward_rows(model, private, input_ids=input_ids, inputs_embeds=inputs_embeds, start=memory)
        finally:
            _active = outer
            for c, value in saved:
                c._attn_implementation_internal = value
    expected = set(range(int(config.num_hidden_layers)))
    if active.seen != expected:
        missing = sorted(expected - active.seen)
        raise CaptureError(
            f"attention capture: layers {missing} were not observed (the model bypassed the attention registry)"
        )
