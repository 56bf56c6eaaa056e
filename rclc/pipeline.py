"""The transfer pipeline (`rclc.transfer`): options -> inputs -> per request: (reason) ->
fit -> masks -> (bridge) -> pooled or prefetched scores -> select -> (reason) -> encode -> deliver.

(This module is not named `transfer`: `rclc.transfer` is the function, and a submodule of
that name would replace it on the package the moment anything imported the module.)

The planning steps make frozen values (rclc/_transfer_plan.py); this module runs the
selections they planned and delivers. Every message of every request is prepared before
the first receiver is called, so a failure or a cancellation anywhere in preparation
delivers nothing. Blocking model work runs in worker threads whose cancellation waits for
the thread (see `_worker`); the snapshot of senders and receivers holds the process-wide
preparation lock.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from ._sync import call_sync
from ._transfer_plan import (
    Handoff,
    ReasoningOptions,
    RequestPlan,
    TransferOptions,
    fit_counts,
    plan_request,
    reasoned_states,
    request_ids,
    resolve,
)
from ._worker import run_in_worker
from .errors import IncompatibleStateError
from .exclusion import Exclusion
from .policy import DEFAULT_REPRESENTATION
from .reasoning import apply_reasoning, selected_state
from .selection import build_selection
from .selectors import transfer_steps
from .state import Delivery, Message, SenderState, embedding_weight, rows_match_ids


def _encode(state: SenderState, rows: torch.Tensor, ids: torch.Tensor | None, representation: str) -> Message:
    rows = rows.detach()
    if representation == "embeddings":
        source = None if ids is None else ids.detach().to("cpu").contiguous()
        return Message(rows.to("cpu").contiguous(), source_ids=source)
    assert ids is not None
    if not rows_match_ids(rows, ids, embedding_weight(state.model)):
        raise IncompatibleStateError(
            "representation: the selected token IDs do not reproduce the sender's input rows; "
            "use representation='embeddings' for this sender"
        )
    warnings.warn(
        "representation 'token_ids+continuous' is experimental (validated on dense decoders of one checkpoint only)",
        UserWarning,
        stacklevel=3,
    )
    continuous = (ids < 0).to(rows.device)
    return Message(rows[continuous].to("cpu").contiguous(), ids.to("cpu").contiguous())


async def _prepare_message(plan: RequestPlan, sender: int, options: TransferOptions) -> Message:
    """One sender's message for one request: its selection, post-selection reasoning, encoding."""
    state, ids, count = plan.states[sender], plan.ids[sender], plan.counts[sender]
    reserve, reasoning = options.reserve, options.reasoning
    rows, kept_ids, indices = await run_in_worker(
        lambda: transfer_steps.select(state, ids, count - reserve, options.selector, exclude=plan.masks[sender],
                                      profile=plan.profiles[sender], span_starts=plan.starts[sender],
                                      fold=plan.folds[sender], pooled=plan.pooled))
    added = 0
    if reasoning is not None and not reasoning.before_selection:
        chosen = await run_in_worker(selected_state, state, rows, kept_ids)
        request = ids if reasoning.with_request else None
        extended = await apply_reasoning(reasoning.method, chosen, maximum=reserve, request_ids=request,
                                         request_positions=0 if request is None else int(request.shape[1]))
        added = extended.positions - chosen.positions
        rows, kept_ids = extended.input_embeds, extended.token_ids

    def encode() -> Message:
        message = _encode(state, rows, kept_ids, options.representation)
        if not options.record_selection:
            return message
        record = build_selection(
            total=state.positions, indices=indices, budget=count, latent_steps=state.latent_steps,
            token_ids=state.token_ids, tokenizer=state.tokenizer, added_latent_positions=added,
            excluded=plan.masks[sender], allocation=options.allocation, cap=plan.caps[sender], bridge=plan.bridge,
        )
        return replace(message, selection=record)

    return await run_in_worker(encode)


async def _delivery(handoff: Handoff, options: TransferOptions, index: int, states: Sequence[SenderState],
                    ids: Sequence[torch.Tensor], fitted: list[int] | None) -> Delivery:
    """Plan request `index` (its own full-context reasoning first, when asked) and prepare its messages."""
    reasoning = options.reasoning
    if reasoning is not None and reasoning.context == "full_with_request":
        states = await reasoned_states(states, options, [int(request.shape[1]) for request in ids], ids)
    if fitted is None:  # reasoning before selection changed the states: fit them now
        fitted = fit_counts(handoff, states, index, options, reserve=0)
    plan = await plan_request(handoff, options, index, states, ids, fitted)
    messages = [await _prepare_message(plan, sender, options) for sender in range(len(states))]
    return Delivery(plan.request, tuple(messages))


async def _deliver(handoff: Handoff, deliveries: list[Delivery]) -> None:
    for r, delivery in enumerate(deliveries):
        for k, target in enumerate(handoff.receivers):
            prompt = handoff.prompts.get((k, r))
            if prompt is not None:
                target._enqueue(delivery, prompt)
                continue
            result = target(delivery)
            if inspect.isawaitable(result):
                await result


async def transfer(  # the public signature of api.md: one keyword per option, so more than 10 parameters
    sender: Any,
    receiver: Any,
    request: Any,
    *,
    ratio: int | None = None,
    budget: int | None = None,
    selector: Any = None,
    representation: str = DEFAULT_REPRESENTATION,
    reasoning: Any = None,
    reasoning_context: str | None = None,
    reasoning_budget: int | None = None,
    record_selection: bool = False,
    exclude: Exclusion | None = None,
    allocation: str = "per_sender",
    span_starts: Sequence[Sequence[int] | None] | None = None,
) -> None:
    """Hand each sender's request-selected state to every receiver, once per request.

    Senders, receivers and requests are one item or a sequence; every receiver gets one
    Delivery per request holding one Message per sender (sender-list order). Budgets are
    relative (`ratio`, default r4) or bounded (`budget`). `exclude=rclc.Exclusion(...)`
    passes over positions the receivers already hold or that carry no content of the
    sender's own (rclc.exclusion); `allocation="pooled"` spends the senders' fitted total
    where the scores are highest across them. `span_starts` (one entry per sender: None,
    or positions where a run of its rows begins, such as the joins between rows inherited
    from different hops) also cut the built-in selectors' text-aligned spans, so no span
    straddles two runs. Returns None after delivering.
    """
    options = TransferOptions.check(
        ratio=ratio, budget=budget, selector=selector, representation=representation,
        reasoning=ReasoningOptions.check(reasoning, reasoning_context, reasoning_budget),
        record_selection=record_selection, exclude=exclude, allocation=allocation,
    )
    handoff = await run_in_worker(resolve, sender, receiver, request, options, span_starts)
    fits_now = options.reasoning is None or not options.reasoning.before_selection
    fitted = [fit_counts(handoff, handoff.senders, r, options, options.reserve) if fits_now else None
              for r in range(len(handoff.requests))]
    ids = await run_in_worker(request_ids, handoff)  # ids[sender][request]
    states: Sequence[SenderState] = handoff.senders
    if options.reasoning is not None and options.reasoning.context == "full":
        longest = [max(int(request.shape[1]) for request in mine) for mine in ids]  # room for every request
        states = await reasoned_states(states, options, longest)
    deliveries = []
    for r in range(len(handoff.requests)):
        per_sender = [ids[i][r] for i in range(len(handoff.senders))]
        deliveries.append(await _delivery(handoff, options, r, states, per_sender, fitted[r]))
    await _deliver(handoff, deliveries)


def transfer_sync(sender: Any, receiver: Any, request: Any, **options: Any) -> None:
    """`transfer` from synchronous code (async callbacks still work). Inside a running event
    loop (a Jupyter cell) it runs on a loop of its own in a worker thread (`rclc.call_sync`);
    from async code, `await rclc.transfer(...)` is the better call."""
    call_sync(transfer, sender, receiver, request, **options)
