"""Everything that touches HF caches and backbone forwards, in one place.

Transformers changed the forward keyword for the cache (`past_key_values` became `cache`
in 5.x) and generate outputs followed. Every forward rclc runs goes through `forward_rows`,
which picks the keyword the installed model accepts, so the rest of the core never
mentions either name and runs without deprecation warnings on every tested release.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ._locks import forward_slot
from ._worker import check_stop
from .errors import RclcError


def backbone(model: Any) -> Any:
    """The decoder stack (no LM head): what rclc forwards for rows, captures and caches."""
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        decoder = get_decoder()
        if decoder is not None:
            return decoder
    return getattr(model, "model", model)


@lru_cache(maxsize=64)
def _cache_keyword_for(forward_type: type) -> str:
    parameters = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_keyword(module: Any) -> str:
    """`cache` on current transformers, `past_key_values` on releases before the rename."""
    return _cache_keyword_for(type(module))


def new_cache(model: Any) -> Any:
    """An empty DynamicCache shaped for `model` (one layer per decoder layer where the config says)."""
    return DynamicCache(config=model.config)


def cache_length(cache: Any) -> int:
    """Positions a cache holds (0 for None)."""
    return 0 if cache is None else int(cache.get_seq_length())


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each `[batch, kv_heads, positions, head_dim]`."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise RclcError(f"past_key_values: expected a transformers Cache with layers, got {type(cache).__name__}")
    out = []
    for layer in layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None or not getattr(layer, "is_initialized", True):
            raise RclcError("past_key_values: the cache has an uninitialized layer; pass a cache built by a forward")
        out.append((keys, values))
    return out


def cache_from_layers(model: Any, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A DynamicCache holding exactly these tensors (no copy): later appends concatenate into new tensors."""
    cache = new_cache(model)
    if len(cache.layers) != len(layers):
        # Configs without layer metadata start empty and grow on demand.
        cache.layers = [DynamicLayer() for _ in layers]
    for layer, (keys, values) in zip(cache.layers, layers):
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return cache


def view_cache(model: Any, cache: Any) -> Any:
    """A new cache object sharing the tensors of `cache`.

    DynamicCache appends by concatenation, which allocates new tensors, so forwarding new
    rows over the view never writes into the caller's tensors. This is the cheap private
    copy the selectors and rollouts need; `clone_cache` is for callers that may write in place.
    """
    return cache_from_layers(model, cache_layers(cache))


def clone_cache(model: Any, cache: Any) -> Any:
    """A deep copy: new tensors, safe to hand to code we do not trust not to write in place."""
    return cache_from_layers(model, [(k.clone(), v.clone()) for k, v in cache_layers(cache)])


def crop_cache(model: Any, cache: Any, length: int) -> Any:
    """A view of the first `length` positions (shares storage)."""
    return cache_from_layers(model, [(k[..., :length, :], v[..., :length, :]) for k, v in cache_layers(cache)])


def generation_cache(output: Any) -> Any:
    """The cache of a `generate(..., return_dict_in_generate=True)` output on any tested release."""
    for name in ("cache", "past_key_values"):
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    return None


def forward_rows(
    model: Any,
    cache: Any,
    *,
    inputs_embeds: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    start: int | None = None,
) -> tuple[torch.Tensor, Any]:
    """Forward new rows over `cache` at dense positions; return (last hidden states, cache).

    Rows are `[1, n, hidden]` embeddings or `[1, n]` IDs. The cache object is extended in
    place (callers pass a view or a fresh cache). Runs in the model's forward slot (one
    worker-side forward per model at a time; see `rclc._locks`). Inside a worker whose
    caller was cancelled it raises `WorkCancelled` instead of starting another forward
    (see `rclc._worker`).
    """
    decoder = backbone(model)
    memory = cache_length(cache) if start is None else start
    rows = inputs_embeds.shape[1] if inputs_embeds is not None else input_ids.shape[1]
    device = (inputs_embeds if inputs_embeds is not None else input_ids).device
    if cache is None:
        cache = new_cache(model)
    kwargs = {
        cache_keyword(decoder): cache,
        "position_ids": torch.arange(memory, memory + rows, device=device).unsqueeze(0),
        "attention_mask": torch.ones(1, memory + rows, dtype=torch.long, device=device),
        "use_cache": True,
    }
    if inputs_embeds is not None:
        kwargs["inputs_embeds"] = inputs_embeds
    else:
        kwargs["input_ids"] = input_ids
    return _run_backbone(model, decoder, kwargs), cache


def forward_batch(model: Any, cache: Any, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Forward `[batch, rows]` IDs at per-row `position_ids` over `cache` (a batched
    capture's, whose attention joins each row to its own memory: no mask is needed here);
    return the last hidden states. Same slot and cancellation rules as `forward_rows`."""
    decoder = backbone(model)
    kwargs = {cache_keyword(decoder): cache, "input_ids": input_ids, "position_ids": position_ids, "use_cache": True}
    return _run_backbone(model, decoder, kwargs)


def _run_backbone(model: Any, decoder: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    # no_grad rather than inference_mode: the cache outlives this call and users may run
    # autograd-recording code (custom selectors, reasoning methods) over it.
    with forward_slot(model), torch.no_grad():
        check_stop()  # in the slot: a forward that waited for it does not start once cancelled
        output = decoder(**kwargs)
    return output.last_hidden_state


def prefill(model: Any, rows: torch.Tensor) -> Any:
    """A fresh cache built from `[T, hidden]` input rows at positions 0..T-1."""
    _, cache = forward_rows(model, None, inputs_embeds=rows.unsqueeze(0), start=0)
    return cache


def extend(model: Any, cache: Any, rows: torch.Tensor) -> Any:
    """A new cache: `cache` (untouched) followed by `[n, hidden]` rows at the next positions."""
    if rows.shape[0] == 0:
        return view_cache(model, cache)
    _, extended = forward_rows(model, view_cache(model, cache), inputs_embeds=rows.unsqueeze(0))
    return extended
