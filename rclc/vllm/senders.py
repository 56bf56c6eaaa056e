"""Sender states from vLLM captures: an HF-shaped view, the captured KV and the prompt rows.

A capture holds the KV pages the engine computed for a prompt; together with the exact
input rows (embedding lookups of the prompt IDs, or continuous rows the prompt was given
as) and the shared-weight view it is a `SenderState` like any HF sender's. Bound agents
make their own captures with `prefill_state`: one discarded one-token greedy request.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._arguments import is_exact_int
from .._cache import cache_from_layers
from .._locks import share_forward_slot
from .._worker import WorkCancelled, current_stop
from ..errors import CaptureError, ContextLimitError, IncompatibleStateError, RclcError
from ..selectors._shared_capture import shared_capture
from ..state import SenderState, build_state, embedding_weight
from .capture import registry
from .engine import _engine, engine_context_limit, engine_tokenizer, require_idle
from .submission import engine_loop, run_request
from .view import model_from_vllm

CAPTURE_DEADLINE_S = 600.0

_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prompt_ids(token_ids: Any, vocab: int, *, continuous: bool = False) -> torch.Tensor:
    """The prompt as a 1-D int64 CPU tensor, checked against the vocabulary.

    `continuous=True` also accepts -1 (a row given as an embedding, not a token).
    """
    if isinstance(token_ids, (list, tuple)) and all(is_exact_int(value) for value in token_ids):
        token_ids = torch.tensor(list(token_ids), dtype=torch.int64)
    if not isinstance(token_ids, torch.Tensor) or token_ids.dtype != torch.int64 or token_ids.dim() != 1:
        raise RclcError(
            "token_ids: expected the exact prompt as a 1-D int64 tensor (or a list of ints), including "
            "chat-template tokens and without generated tokens"
        )
    if token_ids.shape[0] < 1:
        raise RclcError("token_ids: the prompt is empty")
    low = -1 if continuous else 0
    if bool(((token_ids < low) | (token_ids >= vocab)).any()):
        extra = " (-1 marks a row given as an embedding)" if continuous else ""
        raise RclcError(f"token_ids: every ID must lie in [{low}, {vocab}){extra}")
    return token_ids.cpu()


def _rows(model: Any, ids: torch.Tensor, input_embeds: torch.Tensor | None) -> torch.Tensor:
    weight = embedding_weight(model)
    if input_embeds is None:
        with torch.no_grad():
            return weight[ids.to(weight.device)]
    if not isinstance(input_embeds, torch.Tensor) or tuple(input_embeds.shape) != (ids.shape[0], weight.shape[1]):
        shape = list(input_embeds.shape) if isinstance(input_embeds, torch.Tensor) else type(input_embeds).__name__
        raise RclcError(
            f"input_embeds: expected [{ids.shape[0]}, {weight.shape[1]}] rows aligned with token_ids, got {shape}"
        )
    return input_embeds.to(device=weight.device, dtype=weight.dtype)


def state_from_capture(
    model: Any,
    tokenizer: Any,
    capture_id: str,
    token_ids: Any,
    *,
    inherited_positions: int = 0,
    input_embeds: torch.Tensor | None = None,
) -> SenderState:
    """A SenderState from the finished capture `capture_id` of the prompt `token_ids`.

    The registry entry is released only when the state validates; on any error it stays
    (call `discard_capture` to drop it). CaptureError if the capture is missing or failed.
    """
    weight = embedding_weight(model)
    ids = prompt_ids(token_ids, weight.shape[0], continuous=input_embeds is not None)
    capture = registry.get_capture(capture_id)
    if capture.length != ids.shape[0]:
        raise IncompatibleStateError(
            f"token_ids: the capture holds {capture.length} positions but the prompt has {ids.shape[0]}; pass the "
            "exact captured prompt (without generated tokens)"
        )
    layers = int(model.config.num_hidden_layers)
    if len(capture.layers) != layers:
        raise IncompatibleStateError(f"capture_id: the capture has {len(capture.layers)} layers, the model {layers}")
    rows = _rows(model, ids, input_embeds)
    placed = [(k.to(device=weight.device, dtype=weight.dtype), v.to(device=weight.device, dtype=weight.dtype))
              for k, v in capture.layers]
    cache = cache_from_layers(model, placed)
    state = build_state(
        model, tokenizer, rows, ids.to(weight.device), inherited_positions=inherited_positions, cache=cache
    )
    registry.release_capture(capture_id, capture)
    return state


def shared_view(llm: Any, *, allow_unstable: bool = False) -> Any:
    """The engine's HF-shaped view, built once per engine object and reused.

    Its forwards share the engine's step lock (the view runs the engine's own GEMMs, which
    must not run during an engine step), so selection interleaves with generation step by
    step instead of waiting for whole generations.
    """
    try:
        view = _views.get(llm)
    except TypeError:  # an object that cannot be weakly referenced: build each time
        return _view_sharing_the_step_lock(llm, allow_unstable)
    if view is None:
        view = _view_sharing_the_step_lock(llm, allow_unstable)
        _views[llm] = view
    return view


def _view_sharing_the_step_lock(llm: Any, allow_unstable: bool) -> Any:
    loop = engine_loop(llm)
    with loop.step_lock:  # building reads weights through the engine's GEMMs
        view = model_from_vllm(llm, allow_unstable=allow_unstable)
    share_forward_slot(view, loop.step_lock)
    # The view's forwards hold the engine's step lock, so a slot holder's wait for other
    # transfers' captures would stall generation: each transfer captures alone.
    shared_capture(view).configure(1)
    return view


def sender_from_vllm(
    llm: Any,
    capture_id: str,
    token_ids: Any,
    *,
    inherited_positions: int = 0,
    allow_unstable: bool = False,
) -> SenderState:
    """A sender from a capture your own loop made (see `request_capture`); only the prompt is captured."""
    model = shared_view(llm, allow_unstable=allow_unstable)
    return state_from_capture(
        model, engine_tokenizer(llm), capture_id, token_ids, inherited_positions=inherited_positions
    )


def prefill_state(
    llm: Any,
    model: Any,
    tokenizer: Any,
    token_ids: Any,
    *,
    input_embeds: torch.Tensor | None = None,
    inherited_positions: int = 0,
) -> SenderState:
    """Prefill `token_ids` (or `input_embeds` rows) on the idle engine and return the captured state.

    Submits one discarded greedy request (one output token, EOS ignored) registered for
    capture through the engine's submission loop (so it is prefilled together with other
    agents' requests), waits for it, and always discards the capture afterwards. The prompt
    needs one spare position below the engine's context limit.
    """
    from vllm import SamplingParams  # the optional extra: only engine-bound callers get here

    weight = embedding_weight(model)
    ids = prompt_ids(token_ids, weight.shape[0], continuous=input_embeds is not None)
    rows = _rows(model, ids, input_embeds) if input_embeds is not None else None
    limit = engine_context_limit(llm)
    if ids.shape[0] + 1 > limit:
        raise ContextLimitError(
            f"token_ids: {ids.shape[0]} positions plus the capture's one output token exceed the engine's "
            f"context limit {limit} (max_model_len)"
        )
    engine = _engine(llm)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = (
        {"prompt_token_ids": ids.tolist()}
        if rows is None
        else {"prompt_embeds": rows.detach().to(device="cpu", dtype=engine.model_config.dtype)}
    )
    # Other agents' requests may share the engine (the submission loop adds them all);
    # a user's own unfinished requests may not.
    require_idle(llm)
    cancel = current_stop()
    submitted = run_request(llm, prompt, params, capture=True, cancel=cancel, deadline_s=CAPTURE_DEADLINE_S)
    capture_id = submitted.internal_id
    try:
        if submitted.error is not None:
            raise submitted.error
        if submitted.cancelled:
            if submitted.expired:
                raise CaptureError(f"capture prefill did not finish within {CAPTURE_DEADLINE_S:.0f} s")
            raise WorkCancelled("the caller was cancelled; the capture request was aborted")
        finished = submitted.output
        cached = getattr(finished, "num_cached_tokens", 0) or 0
        if cached:
            raise CaptureError(
                f"the capture prefill reused {cached} cached positions; disable prefix caching "
                "(enable_prefix_caching=False)"
            )
        return state_from_capture(
            model, tokenizer, capture_id, ids, inherited_positions=inherited_positions, input_embeds=rows
        )
    finally:
        if capture_id is not None:
            registry.discard_capture(capture_id)
