"""Reasoning before or after selection: the built-in latent rollout and the wrapper for any method.

A reasoning method appends continuous rows (and their KV) to a sender's state. The
built-in `latent_mass` is the paper's rule: feed the backbone's final hidden row back as
the next input row, rescaled to the mean input-embedding norm. `apply_reasoning` is what
the transfer pipeline calls: it sizes the allowance, isolates custom methods from the
caller's tensors, runs sync methods in a worker and async ones on the caller's loop, and
refuses a custom result that breaks the sender's invariants before anything is delivered.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ._arguments import optional_int, require_int
from ._cache import cache_from_layers, cache_layers, clone_cache, crop_cache, forward_rows, view_cache
from ._worker import run_in_worker
from .errors import ContextLimitError, RclcError, ReasoningError
from .models import context_limit_of
from .state import SenderState, build_state, embedding_weight
from .user_code import user_code_turn

# Relative / absolute tolerances for "the cache prefix was kept" per KV dtype. Custom
# methods may legitimately recompute the prefix (e.g. re-prefill), so exact equality
# would be too strict; these bounds are roughly one to a few units in the last place.
_PREFIX_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
}
_OTHER_TOLERANCE = (1e-7, 1e-7)

_NORM_FLOOR = 1e-6


# ---------------------------------------------------------------------------------------
# Built-in latent rollout


def latent_mass_sync(
    state: SenderState,
    *,
    steps: int,
    request: str | torch.Tensor | None = None,
    max_positions: int | None = None,
) -> SenderState:
    """Append `steps` latent rows to `state` and return a new state (the input is untouched).

    Each step forwards `h / max(||h||, 1e-6) * nu` as an input row, where `h` is the final
    (normed) hidden row of the previous forward and `nu` the mean L2 norm of the input
    embedding table. With `request`, the rollout is conditioned on the request tokens, but
    the returned cache holds only the old rows followed by the new rows at dense positions.
    `steps == 0` returns `state` itself.
    """
    require_int("steps", steps, minimum=0)
    optional_int("max_positions", max_positions, minimum=0)
    if max_positions is not None and steps > max_positions:
        raise RclcError(
            f"steps: {steps} latent steps exceed max_positions={max_positions}; lower steps or raise "
            "reasoning_budget (max_positions is the room the caller allows)"
        )
    state.validate()
    request_tokens = None if request is None else state.request_ids(request)
    if steps == 0:
        return state

    model = state.model
    rows = state.input_embeds
    total = state.positions
    request_length = 0 if request_tokens is None else int(request_tokens.shape[1])
    limit = context_limit_of(model)
    if total + request_length + steps > limit:
        raise ContextLimitError(
            f"steps: {total} sender rows + {request_length} request tokens + {steps} latent steps exceed "
            f"the model's context limit of {limit} positions; use fewer steps or a shorter state"
        )

    with torch.no_grad():
        weight = embedding_weight(model)
        if request_tokens is not None:
            # Request tokens condition the rollout only; they run over a view of the
            # caller's cache (appends allocate new tensors, the caller's stay untouched).
            hidden, rollout = forward_rows(
                model, view_cache(model, state.past_key_values), inputs_embeds=weight[request_tokens]
            )
        else:
            hidden, rollout = _reforward_last_row(model, state)
        # The norm is taken in float32 over the whole table and recomputed every call, so
        # a model whose embeddings were swapped is never rolled with a stale target.
        target_norm = weight.float().norm(dim=-1).mean().to(dtype=hidden.dtype, device=hidden.device)
        latent_rows = []
        for _ in range(steps):
            last = hidden[:, -1:, :]
            row = last / last.norm(dim=-1, keepdim=True).clamp_min(_NORM_FLOOR) * target_norm
            latent_rows.append(row)
            hidden, rollout = forward_rows(model, rollout, inputs_embeds=row)
        new_rows = torch.cat(latent_rows, dim=1)  # [1, steps, hidden]
        if request_tokens is not None:
            # The rows were produced at positions shifted by the request; the returned
            # cache places them densely right after the original prefix.
            _, rollout = forward_rows(model, view_cache(model, state.past_key_values), inputs_embeds=new_rows)

    ids = state.token_ids
    if ids is not None:
        ids = torch.cat([ids, torch.full((steps,), -1, dtype=ids.dtype, device=ids.device)])
    return dataclasses.replace(
        state,
        past_key_values=rollout,
        input_embeds=torch.cat([rows, new_rows[0].to(rows.dtype)], dim=0),
        token_ids=ids,
        latent_steps=state.latent_steps + steps,
    )


def _reforward_last_row(model: Any, state: SenderState) -> tuple[torch.Tensor, Any]:
    """Recompute the last row's final hidden state and return it with a full-length cache.

    Forwarding the last row again over the first T-1 positions gives the hidden state the
    rollout starts from. Its recomputed K/V differ from the cached ones by roundoff, so
    the originals are put back: the cache the rollout extends is the sender's, exactly.
    """
    total = state.positions
    hidden, seeded = forward_rows(
        model,
        crop_cache(model, state.past_key_values, total - 1),
        inputs_embeds=state.input_embeds[total - 1 :].unsqueeze(0),
    )
    original = cache_layers(state.past_key_values)
    restored = []
    for (keys, values), (old_keys, old_values) in zip(cache_layers(seeded), original):
        restored.append(
            (
                torch.cat([keys[..., : total - 1, :], old_keys[..., total - 1 :, :]], dim=-2),
                torch.cat([values[..., : total - 1, :], old_values[..., total - 1 :, :]], dim=-2),
            )
        )
    return hidden, cache_from_layers(model, restored)


async def latent_mass(
    state: SenderState,
    *,
    steps: int,
    request: str | torch.Tensor | None = None,
    max_positions: int | None = None,
) -> SenderState:
    """`latent_mass_sync` in a worker; a cancelled caller waits for the rollout, then re-raises."""
    rollout = functools.partial(latent_mass_sync, state, steps=steps, request=request, max_positions=max_positions)
    return await run_in_worker(rollout)


_BUILTINS = (latent_mass, latent_mass_sync)


def _unwrap_partial(method: Any) -> Any:
    while isinstance(method, functools.partial):
        method = method.func
    return method


def is_builtin_reasoning(method: Any) -> bool:
    """True for `latent_mass`, `latent_mass_sync` and (nested) partials of them: trusted, not revalidated."""
    return any(_unwrap_partial(method) is builtin for builtin in _BUILTINS)


def _is_async_callable(method: Any) -> bool:
    target = _unwrap_partial(method)
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(type(target), "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)


# ---------------------------------------------------------------------------------------
# States handed to and returned by reasoning methods


def private_copy(state: SenderState) -> SenderState:
    """Cloned rows, IDs and cache (new tensors); model and tokenizer shared.

    A custom method may write into whatever it gets; this keeps the caller's sender intact.
    """
    return dataclasses.replace(
        state,
        past_key_values=clone_cache(state.model, state.past_key_values),
        input_embeds=state.input_embeds.clone(),
        token_ids=None if state.token_ids is None else state.token_ids.clone(),
    )


def selected_state(state: SenderState, rows: torch.Tensor, ids: torch.Tensor | None) -> SenderState:
    """A fresh sender made of the selected rows only, prefilled at positions 0..k-1.

    Selected-context reasoning sees just the chosen rows, so its KV must be recomputed
    from them; the discarded rows are gone, hence no latent tail and no inherited prefix.
    """
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] < 1:
        shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise RclcError(f"rows: selected rows must be a [positions >= 1, hidden] tensor, got {shape}")
    limit = context_limit_of(state.model)
    if rows.shape[0] > limit:
        raise ContextLimitError(
            f"rows: {rows.shape[0]} selected rows exceed the model's context limit of {limit} positions; "
            "select fewer rows"
        )
    return build_state(state.model, state.tokenizer, rows, ids)


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _PREFIX_TOLERANCE.get(dtype, _OTHER_TOLERANCE)


def validate_reasoning_result(old: SenderState, new: Any, allowance: int) -> None:
    """Refuse a custom method's result unless it is `old` plus 0..allowance consistent latent rows.

    The method is trusted to compute correct KV for its rows; what is checked is what a
    bug would break: types, counts, the preserved prefix (rows, IDs, cache) and finiteness.
    """
    if type(new) is not SenderState:
        raise ReasoningError(
            f"reasoning: the method returned {type(new).__name__}; it must return an rclc.SenderState"
        )
    try:
        new.validate()
    except ValueError as error:
        raise ReasoningError(f"reasoning: the returned state is inconsistent: {error}") from None
    old_total, new_total = old.positions, new.positions
    added = new_total - old_total
    if added < 0:
        raise ReasoningError(
            f"reasoning: the method removed rows ({old_total} -> {new_total}); it may only append rows"
        )
    if added > allowance:
        raise ReasoningError(
            f"reasoning: the method appended {added} rows but max_positions was {allowance}; respect max_positions"
        )
    if new.model is not old.model:
        raise ReasoningError("reasoning: the returned state has a different model; keep the sender's model object")
    if new.tokenizer is not old.tokenizer:
        raise ReasoningError("reasoning: the returned state has a different tokenizer; keep the sender's tokenizer")
    if new.inherited_positions != old.inherited_positions:
        raise ReasoningError(
            f"reasoning: inherited_positions changed ({old.inherited_positions} -> {new.inherited_positions}); "
            "keep the sender's inherited count"
        )
    if new.latent_steps != old.latent_steps + added:
        raise ReasoningError(
            f"reasoning: latent_steps is {new.latent_steps} but must be {old.latent_steps} + {added} appended "
            "rows; add the appended count to latent_steps"
        )
    if not torch.equal(new.input_embeds[:old_total], old.input_embeds):
        raise ReasoningError("reasoning: the returned rows changed the input prefix; preserve the sender prefix")
    if not bool(torch.isfinite(new.input_embeds[old_total:]).all()):
        raise ReasoningError(
            "reasoning: the appended rows are not finite; preserve the sender prefix and append finite rows"
        )
    if old.token_ids is not None:
        if new.token_ids is None:
            raise ReasoningError("reasoning: the sender had token_ids and the result has none; keep them and append -1")
        if not torch.equal(new.token_ids[:old_total], old.token_ids):
            raise ReasoningError("reasoning: the returned token_ids changed the sender's IDs; keep them as a prefix")
    _check_cache(old, new, old_total, new_total)


def _check_cache(old: SenderState, new: SenderState, old_total: int, new_total: int) -> None:
    old_layers = cache_layers(old.past_key_values)
    try:
        new_layers = cache_layers(new.past_key_values)
    except ValueError as error:
        raise ReasoningError(f"reasoning: {error}") from None
    if len(new_layers) != len(old_layers):
        raise ReasoningError(
            f"reasoning: the returned cache has {len(new_layers)} layers, the sender's {len(old_layers)}; "
            "extend the sender's cache instead of building another"
        )
    for index, (old_pair, new_pair) in enumerate(zip(old_layers, new_layers)):
        for kind, before, after in zip(("keys", "values"), old_pair, new_pair):
            expected = (before.shape[0], before.shape[1], new_total, before.shape[3])
            if tuple(after.shape) != expected:
                raise ReasoningError(
                    f"reasoning: layer {index} {kind} have shape {tuple(after.shape)}, expected {expected}; "
                    "the cache must cover every returned row with the sender's geometry"
                )
            if after.dtype != before.dtype or after.device != before.device:
                raise ReasoningError(
                    f"reasoning: layer {index} {kind} are {after.dtype} on {after.device}, the sender's "
                    f"{before.dtype} on {before.device}; keep the cache's dtype and device"
                )
            rtol, atol = _tolerance(before.dtype)
            if not torch.allclose(after[..., :old_total, :], before, rtol=rtol, atol=atol):
                raise ReasoningError(
                    f"reasoning: layer {index} {kind} drifted from the sender's cache on the first {old_total} "
                    "positions; preserve the cache prefix"
                )
            if not bool(torch.isfinite(after[..., old_total:, :]).all()):
                raise ReasoningError(f"reasoning: layer {index} {kind} of the appended positions are not finite")


# ---------------------------------------------------------------------------------------
# The wrapper the transfer pipeline calls


async def _call_in_worker(call: Callable[[], Any]) -> Any:
    """Run a sync method in a worker; if the caller was cancelled meanwhile, close a coroutine it returned.

    A sync method may return an awaitable. When cancellation discards that result, an
    unawaited coroutine would otherwise linger and warn at garbage collection.
    """
    produced: list[Any] = []

    def run() -> None:
        produced.append(call())

    try:
        await run_in_worker(run)
    except BaseException:
        for result in produced:
            if inspect.iscoroutine(result):
                result.close()
        raise
    return produced[0]


def _call_in_turn(method: Callable[..., Any], builtin: bool, state: SenderState, keywords: dict[str, Any]) -> Any:
    """A sync method in its worker thread, under the user-code turn unless exempt (rclc.user_code)."""
    with user_code_turn(method, builtin=builtin):
        return method(state, **keywords)


async def apply_reasoning(
    method: Callable[..., Any],
    state: SenderState,
    *,
    maximum: int | None,
    request_ids: torch.Tensor | None,
    request_positions: int,
) -> SenderState:
    """Run one reasoning method on `state` within the context it may use; return the extended state.

    `maximum` is the caller's reasoning budget (None: all remaining context);
    `request_positions` the request length that must still fit after reasoning.
    """
    capacity = context_limit_of(state.model) - state.positions - request_positions
    allowance = capacity if maximum is None else min(maximum, capacity)
    if allowance < 0:
        raise ContextLimitError(
            f"reasoning: the sender's {state.positions} rows and {request_positions} request tokens exceed the "
            f"model's context limit of {context_limit_of(state.model)} positions; shorten the state or request"
        )
    builtin = is_builtin_reasoning(method)
    given = state if builtin else await run_in_worker(private_copy, state)
    # api.md's signature: `request` is always passed, None when the context has no request
    keywords: dict[str, Any] = {"max_positions": allowance, "request": None if request_ids is None else request_ids.clone()}
    if _is_async_callable(method):
        result = method(given, **keywords)  # on the caller's loop: free to await other work (no turn held)
    else:
        result = await _call_in_worker(functools.partial(_call_in_turn, method, builtin, given, keywords))
    if inspect.isawaitable(result):
        result = await result
    if not builtin:
        await run_in_worker(validate_reasoning_result, state, result, allowance)
    return result
