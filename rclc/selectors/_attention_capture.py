"""Attention capture: run extra query rows over a private view of a sender's cache with the
model's own attention kernel, and hand each global layer's post-RoPE queries and full keys
to a `fold` callback.

Why a registered implementation rather than hooks: the post-RoPE query and the key tensor
*after* the cache append only exist inside the attention call. Transformers dispatches that
call by name (`config._attn_implementation`) through `ALL_ATTENTION_FUNCTIONS`, and builds
the mask through `ALL_MASK_ATTENTION_FUNCTIONS` under the same name. We register one extra
name whose functions delegate to the model's original implementation with the same
arguments, so every output is exactly what it would have been, and a capture's fold sees
the tensors in passing.

One exception, on purpose (issue 28): a fold that can compute a layer's output itself (the
support fold behind CacheBack and QSnap: `attend`) gets the capturing thread's global
layers. It computes the softmax the scores need anyway and returns that softmax times the
values as the layer's output, so the capture runs attention once per layer instead of twice
(the model's kernel, then the fold's own), which brought selection from 1.2-1.3x to about
1.0x its forward floor (docs/performance.md). The output agrees with the model's kernel to
float32 rounding, so the capture's later layers, and its scores, may differ from a capture
through the kernel in the last bits; every other forward (other threads, other layers, any
other fold) is served by the original implementation, unchanged.

Per thread, not per process: a capture is recorded in the capturing thread only
(`threading.local`). While at least one capture of a model runs (in any thread), the
model's configs name the delegating implementation; a forward of that model in any other
thread (the batching engine's decode, another run's prefill, another capture) goes through
the same delegates, is served exactly as by the original implementation and folds nothing
unless its own thread has an active capture of that model. So captures and other forwards
on one model run concurrently, and no lock is held across a capture. When the last capture
of a model ends its configs get their exact previous values back (written back by
identity), so an idle model is the user's model as it was.

Several captures of one model (a fan-in's senders, all scored against one request) can run
as one batched forward (`capture_each`): the request rows go through the projections and
MLPs together, while each sender's attention runs alone over its own memory, so its fold
sees exactly the tensors its own capture would (the short request of a capture costs about
what a decode step does, mostly reading the weights, so batching pays it once).

Switching writes every reachable config's `_attn_implementation_internal` directly.
`model.set_attn_implementation` would also work but re-validates the implementation and
walks every module on each call, and we need to restore the exact previous values anyway
(measured in benchmarks/selection_overhead.py: `switch_ms`). Which implementation a
delegate forwards to is kept per config object, and kept for the config's lifetime, so a
forward that read the delegating name just before the last capture ended still finds it.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .._cache import cache_layers, cache_length, crop_cache, forward_batch, forward_rows, view_cache
from ..errors import CaptureError, RclcError
from ..models import CAPTURE_ATTENTION

CAPTURE_NAME = CAPTURE_ATTENTION  # models.check_model must recognise the delegating name

Fold = Callable[[torch.Tensor, torch.Tensor, float], None]

_registration_lock = threading.Lock()
_registered = False


@dataclass(frozen=True)
class _Delegate:
    """What the registered functions forward to for one config object."""

    config: weakref.ref
    attention: Callable[..., Any] | None  # None: the model's own eager function, resolved per module
    mask: Callable[..., Any]


@dataclass
class _Install:
    """One model switched to the delegating name: the values to write back, and its capture count."""

    saved: list[tuple[Any, Any]]
    configs: frozenset[int]
    users: int = 0


@dataclass(frozen=True)
class _Element:
    """One capture of a batched forward (`capture_each`): its own memory, layer by layer."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]  # its private cache's (keys, values) per layer
    memory: int
    rows: int
    fold: Fold
    offset: int  # where its request rows start in the packed forward


class _RequestLayer(DynamicLayer):
    """One layer of a batched capture's cache: it keeps nothing and hands the request rows'
    keys and values straight to the attention, which joins them to each element's own
    memory (`_attend_each`). So the senders' caches are never padded to a common length:
    padding would copy every cache into a larger buffer (and page in fresh memory) only for
    the attention to cut it out again."""

    def __init__(self, memory: int, device: torch.device) -> None:
        super().__init__()
        self.memory = memory  # the longest element's: what the model's positions and masks assume
        self.device = device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.memory

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.memory + query_length, 0


@dataclass
class _ActiveCapture:
    """One capture running in this thread: its fold (or, batched, its elements) and what it checks."""

    model: Any
    fold: Fold | None
    configs: frozenset[int]  # ids of the captured model's configs (a fold may forward another model)
    keys_expected: int
    global_layers: frozenset[int]
    seen: set[int] = field(default_factory=set)
    elements: tuple[_Element, ...] = ()


_install_lock = threading.Lock()
_installs: dict[int, _Install] = {}  # id(model) -> its install, while a capture of it runs
_delegates: dict[int, _Delegate] = {}  # id(config) -> where its delegating calls go
_local = threading.local()  # .captures: this thread's active captures, innermost last


def active_captures() -> tuple[_ActiveCapture, ...]:
    """This thread's running captures, outermost first (empty outside a capture)."""
    return tuple(getattr(_local, "captures", ()))


def _capturing(config: Any) -> _ActiveCapture | None:
    """The innermost capture of this thread that captures the model `config` belongs to."""
    for active in reversed(getattr(_local, "captures", ())):
        if id(config) in active.configs:
            return active
    return None


def _delegate(config: Any) -> _Delegate:
    entry = _delegates.get(id(config)) if config is not None else None
    if entry is None or entry.config() is not config:
        raise CaptureError(
            f"attention capture: a model is configured with {CAPTURE_NAME!r} outside a capture; "
            "its previous attention implementation was not restored (set model.config._attn_implementation back)"
        )
    return entry


def _eager_attention(module: Any) -> Callable[..., Any]:
    function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if function is None:
        raise CaptureError(
            f"attention capture: {type(module).__name__} has no module-level eager_attention_forward to delegate to; "
            "load the model with attn_implementation='sdpa'"
        )
    return function


def _capture_attention(module: Any, query: torch.Tensor, key: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    config = getattr(module, "config", None)
    entry = _delegate(config)
    attention = entry.attention if entry.attention is not None else _eager_attention(module)
    active = _capturing(config)
    if active is not None and active.elements:
        return _attend_each(active, module, attention, query, key, args, kwargs), None
    if active is None:
        # Another thread's capture switched this model: serve this forward, fold nothing.
        return attention(module, query, key, *args, **kwargs)[0], None
    layer = _seen_layer(active, module)
    if layer not in active.global_layers or active.fold is None:
        return attention(module, query, key, *args, **kwargs)[0], None
    _check_keys(layer, key, active.keys_expected)
    scaling = _scaling(module, query, kwargs)
    attend = _attending(active.fold, args, kwargs)
    if attend is not None:  # the fold's own softmax gives the layer's output: attention runs once
        return attend(query, key, args[0], scaling), None
    output = attention(module, query, key, *args, **kwargs)[0]
    active.fold(query, key, scaling)
    return output, None


def _attending(fold: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., torch.Tensor] | None:
    """`fold.attend` when the fold can compute the layer's output itself (a support fold) and
    the layer's attention is plain softmax attention (no dropout, window, soft cap or sinks,
    which the fold's arithmetic does not model); None otherwise."""
    attend = getattr(fold, "attend", None)
    if attend is None or not args:
        return None
    if float(kwargs.get("dropout") or 0.0) != 0.0:
        return None
    if any(kwargs.get(name) is not None for name in ("sliding_window", "softcap", "s_aux", "sinks")):
        return None
    return attend


def _seen_layer(active: _ActiveCapture, module: Any) -> Any:
    """The attention module's layer index, recorded as seen by the capture."""
    layer = getattr(module, "layer_idx", None)
    active.seen.add(layer)
    return layer


def _check_keys(layer: Any, key: torch.Tensor, expected: int) -> None:
    """A global layer's fold must see every key: the memory and the request rows."""
    if key.shape[-2] != expected:
        raise CaptureError(
            f"attention capture: layer {layer} saw {key.shape[-2]} keys, expected {expected} "
            "(the cache copy was truncated or not extended)"
        )


def _scaling(module: Any, query: torch.Tensor, kwargs: dict[str, Any]) -> float:
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = getattr(module, "scaling", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return float(scaling)


def _attend_each(
    active: _ActiveCapture,
    module: Any,
    attention: Callable[..., Any],
    query: torch.Tensor,
    key: torch.Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """A batched capture's attention, element by element: each element's request rows over
    its own memory followed by its own request keys.

    Why not one batched call: attention over keys padded to a common length sums the same
    terms in a different order, so its output (and every later layer's queries) would
    differ in the last bits from the capture of that sender alone, and a selection could
    then depend on which senders were scored together. Here each element's attention gets
    exactly the query, keys, values and causal mask its own capture would (`capture` hands
    the same boolean mask), so only the projections run batched. The requests are packed one
    after another in one sequence (`_Element.offset`), so the forward computes no padding."""
    if not args:
        raise CaptureError("attention capture: the attention call passed no value states; a batched capture needs them")
    value, rest = args[0], args[2:]  # args[1] is the batch's mask: each element gets its own
    kwargs = {name: item for name, item in kwargs.items() if name != "attention_mask"}
    positions = kwargs.get("position_ids")
    layer = _seen_layer(active, module)
    folding = layer in active.global_layers
    scaling = _scaling(module, query, kwargs)
    outputs = []
    for element in active.elements:
        rows, start = element.rows, element.offset
        own = slice(start, start + rows)
        memory_keys, memory_values = element.layers[layer]
        own_query = query[:, :, own]
        own_key = torch.cat([memory_keys, key[:, :, own]], dim=-2)
        own_value = torch.cat([memory_values, value[:, :, own]], dim=-2)
        if isinstance(positions, torch.Tensor) and positions.dim() == 2:
            kwargs["position_ids"] = positions[:, own]
        attend = _attending(element.fold, args, kwargs) if folding else None
        if folding:
            _check_keys(layer, own_key, element.memory + rows)
        if attend is not None:  # as in `_capture_attention`: the fold's softmax gives the output
            output = attend(own_query, own_key, own_value, scaling)
        else:
            output = attention(module, own_query, own_key, own_value, _causal_mask(element, query.device), *rest,
                               **kwargs)[0]
            if folding:
                element.fold(own_query, own_key, scaling)
        outputs.append(output)
    return torch.cat(outputs, dim=1)


def _causal_mask(element: _Element, device: torch.device) -> torch.Tensor:
    """`[1, 1, rows, memory + rows]`: request row r sees the memory and request rows up to r."""
    shape = (element.rows, element.memory + element.rows)
    return torch.ones(shape, dtype=torch.bool, device=device).tril(element.memory)[None, None]


def _capture_mask(*args: Any, **kwargs: Any) -> Any:
    return _delegate(kwargs.get("config")).mask(*args, **kwargs)


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


def _delegates_for(implementation: str) -> tuple[Callable[..., Any] | None, Callable[..., Any]]:
    if implementation == CAPTURE_NAME:
        raise CaptureError(
            f"attention capture: the model is configured with {CAPTURE_NAME!r} but no capture of it is running; "
            "set model.config._attn_implementation back to 'sdpa' or 'eager'"
        )
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


def _forget_dead_delegates() -> None:
    for key in [key for key, entry in _delegates.items() if entry.config() is None]:
        del _delegates[key]


def _install(model: Any) -> frozenset[int]:
    """Switch `model` to the delegating name (first capture of it), count this capture and
    return the ids of the model's configs."""
    with _install_lock:
        install = _installs.get(id(model))
        if install is None:
            config = model.config
            original = getattr(config, "_attn_implementation", None) or "sdpa"
            attention, mask = _delegates_for(original)
            configs = reachable_configs(model)
            saved = [(c, getattr(c, "_attn_implementation_internal", None)) for c in configs]
            _forget_dead_delegates()
            for c in configs:
                _delegates[id(c)] = _Delegate(weakref.ref(c), attention, mask)
            try:
                for c in configs:
                    c._attn_implementation_internal = CAPTURE_NAME
                if config._attn_implementation != CAPTURE_NAME:
                    raise CaptureError("attention capture: the model refused the capture attention implementation")
            except BaseException:
                for c, value in saved:
                    c._attn_implementation_internal = value
                raise
            install = _Install(saved, frozenset(id(c) for c in configs))
            _installs[id(model)] = install
        install.users += 1
        return install.configs


def _uninstall(model: Any) -> None:
    """Count one capture of `model` out; the last one writes its configs' values back."""
    with _install_lock:
        install = _installs[id(model)]
        install.users -= 1
        if install.users == 0:
            del _installs[id(model)]
            for c, value in install.saved:
                c._attn_implementation_internal = value


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
    and DynamicCache appends by concatenation into fresh tensors. The model's attention
    implementation is back to what it was once no capture of it runs (also when `fold`
    raises). Other threads may forward or capture the same model meanwhile.
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise RclcError("capture: pass exactly one of input_ids or inputs_embeds")
    rows = int((input_ids if input_ids is not None else inputs_embeds).shape[1])
    layers = _check_capturable(model)
    private = _private_cache(model, past, memory)
    _run_captured(
        model,
        lambda: forward_rows(model, private, input_ids=input_ids, inputs_embeds=inputs_embeds, start=memory),
        layers,
        fold=fold,
        keys_expected=memory + rows,
    )


def capture_each(model: Any, requests: list[tuple[Any, int, torch.Tensor, Fold]]) -> None:
    """Several captures of one model in one batched forward: each request is `(past, memory,
    input_ids [1, rows], fold)`, and each fold is called with what `capture` of it alone
    would hand it (`query [1, H, rows, d]`, `key [1, K, memory + rows, d]`).

    Why: a capture forwards a few request rows, so it costs about as much as a decode step
    (every weight is read for a handful of rows); a fan-in's senders captured one by one
    pay that once each, batched once in all. The requests are packed one after another into
    one sequence of rows at their own positions (not padded to the longest: at these sizes a
    CPU forward is compute-bound, so padding rows cost as much as real ones) and run through
    the projections together; attention runs per element over its own memory (see
    `_attend_each`), so only the batched projections' rounding can differ from captures one
    by one (none on a CPU whose BLAS computes a row the same at every batch size:
    benchmarks/fan_in_capture.py measures it).
    """
    if len(requests) == 1:
        past, memory, ids, fold = requests[0]
        capture(model, past, fold, memory, input_ids=ids)
        return
    for _, _, ids, _ in requests:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
            raise RclcError("capture_each: every request's input_ids must be a [1, rows] tensor with rows >= 1")
    layers = _check_capturable(model)
    offsets = [0]
    for _, _, ids, _ in requests:
        offsets.append(offsets[-1] + int(ids.shape[1]))
    elements = tuple(
        _Element(cache_layers(_private_cache(model, past, memory)), memory, int(ids.shape[1]), fold, offset)
        for (past, memory, ids, fold), offset in zip(requests, offsets)
    )
    device = requests[0][2].device
    input_ids = torch.cat([ids.to(device) for _, _, ids, _ in requests], dim=1)
    positions = torch.cat([memory + torch.arange(int(ids.shape[1]), device=device) for _, memory, ids, _ in requests])[None]
    cache = DynamicCache(config=model.config)
    longest = max(element.memory for element in elements)
    cache.layers = [_RequestLayer(longest, device) for _ in range(int(model.config.num_hidden_layers))]
    _run_captured(
        model,
        lambda: forward_batch(model, cache, input_ids, positions),
        layers,
        fold=None,
        keys_expected=0,  # checked per element (`_attend_each`)
        elements=elements,
    )


def _check_capturable(model: Any) -> frozenset[int]:
    """The model's global layers, once it has some and is not being captured by this thread."""
    layers = global_layers(model.config)
    if any(active.model is model for active in active_captures()):
        raise CaptureError("attention capture: captures cannot nest (the model is already being captured)")
    return layers


def _private_cache(model: Any, past: Any, memory: int) -> Any:
    """A view of `past`'s first `memory` positions that a forward may extend without writing `past`."""
    private = view_cache(model, past) if cache_length(past) == memory else crop_cache(model, past, memory)
    if cache_length(private) != memory:
        raise CaptureError(
            f"attention capture: the cache holds {cache_length(past)} positions, fewer than the {memory} requested"
        )
    return private


def _run_captured(
    model: Any,
    forward: Callable[[], Any],
    layers: frozenset[int],
    *,
    fold: Fold | None,
    keys_expected: int,
    elements: tuple[_Element, ...] = (),
) -> None:
    """Run `forward` with this thread capturing `model`, then check every layer was seen."""
    config = model.config
    _register()
    configs = _install(model)
    try:
        active = _ActiveCapture(
            model=model,
            fold=fold,
            configs=configs,
            keys_expected=keys_expected,
            global_layers=layers,
            elements=elements,
        )
        stack = getattr(_local, "captures", None)
        if stack is None:
            stack = _local.captures = []
        stack.append(active)
        try:
            forward()
        finally:
            stack.pop()
    finally:
        _uninstall(model)
    expected = set(range(int(config.num_hidden_layers)))
    if active.seen != expected:
        missing = sorted(expected - active.seen)
        raise CaptureError(
            f"attention capture: layers {missing} were not observed (the model bypassed the attention registry)"
        )
