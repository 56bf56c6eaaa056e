"""The transfer pipeline (`rclc.transfer`): snapshot -> plan budgets -> (reason) -> select ->
(reason) -> encode -> deliver.

(This module is not named `transfer`: `rclc.transfer` is the function, and a submodule of
that name would replace it on the package the moment anything imported the module.)

Every message of every request is prepared before the first receiver is called, so a
failure or a cancellation anywhere in preparation delivers nothing. Blocking model work
runs in worker threads whose cancellation waits for the thread (see `_worker`); the
selector and the snapshot of senders/receivers hold the process-wide preparation lock.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._arguments import require_bool
from ._receiver_aware import accepts_keyword, check_receiver_aware, check_span_starts_option, pool, request_masks
from ._locks import preparation_lock
from ._sync import call_sync
from ._worker import run_in_worker
from .errors import IncompatibleStateError, RclcError
from .exclusion import Exclusion
from .receiver import HFReceiver, PreparedRequest
from .policy import DEFAULT_REPRESENTATION, REASONING_CONTEXTS, REPRESENTATIONS, BudgetPolicy, fit, floor
from .reasoning import apply_reasoning, selected_state
from .selection import build_selection
from .selectors import cacheback, is_builtin
from .selectors._common import SpanProfile
from .selectors._prefetch import prefetch_folds
from .selectors._support import SupportFold, offering
from .selectors._validate import validate_positions
from .state import Delivery, Message, SenderState, embedding_weight, rows_match_ids
from .user_code import user_code_turn


@dataclass(frozen=True)
class ReasoningOptions:
    """A transfer's reasoning arguments, checked: the method, where it runs, its row budget."""

    method: Callable[..., Any]
    context: str
    budget: int | None

    @property
    def before_selection(self) -> bool:
        return self.context.startswith("full")

    @property
    def with_request(self) -> bool:
        return self.context.endswith("_with_request")

    @property
    def reserve(self) -> int:
        """Rows reserved in the budget for post-selection reasoning."""
        return 0 if self.before_selection else int(self.budget or 0)


def reasoning_options(reasoning: Any, context: Any, budget: Any) -> ReasoningOptions | None:
    """Check `reasoning=`, `reasoning_context=` and `reasoning_budget=` together (None: no reasoning)."""
    if reasoning is None:
        if context is not None or budget is not None:
            raise RclcError("reasoning_context, reasoning_budget: they need reasoning=...; pass a reasoning method")
        return None
    context = "full" if context is None else context
    if context not in REASONING_CONTEXTS:
        raise RclcError(f"reasoning_context: {context!r} is not one of {REASONING_CONTEXTS}")
    if not callable(reasoning):
        raise RclcError("reasoning: expected a callable such as functools.partial(rclc.latent_mass, steps=40)")
    if budget is not None and (type(budget) is not int or budget < 0):
        raise RclcError(f"reasoning_budget: expected an int >= 0, got {budget!r}")
    if not context.startswith("full") and budget is None:
        raise RclcError(
            f"reasoning_budget: required with reasoning_context={context!r} (rows reserved after selection)"
        )
    return ReasoningOptions(reasoning, context, budget)


def selector_name(selector: Any) -> str:
    """The name error messages give a selector (through `functools.partial`)."""
    target = selector.func if isinstance(selector, functools.partial) else selector
    return getattr(target, "__name__", type(target).__name__)


def _listify(value: Any, is_single: Callable[[Any], bool], field: str) -> list[Any]:
    if is_single(value):
        return [value]
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            raise RclcError(f"{field}: the list is empty; pass at least one")
        return items
    return [value]


def _is_sender_like(value: Any) -> bool:
    return isinstance(value, SenderState) or callable(getattr(value, "sender_state", None))


@dataclass
class _Snapshot:
    senders: list[SenderState]
    receivers: list[Any]
    requests: list[Any]
    plans: dict[tuple[int, int], PreparedRequest]
    span_starts: list[tuple[int, ...] | None] | None = None


def _resolve_sender(item: Any) -> Any:
    if isinstance(item, SenderState):
        return item
    resolve = getattr(item, "sender_state", None)
    return resolve() if callable(resolve) else item


def _snapshot(
    sender: Any,
    receiver: Any,
    request: Any,
    selector: Any,
    representation: Any,
    exclusion: Exclusion | None = None,
    span_starts: Any = None,
) -> _Snapshot:
    """Resolve agents, validate every input and plan every planned receiver (worker, prep lock)."""
    with preparation_lock:
        senders = [_resolve_sender(item) for item in _listify(sender, _is_sender_like, "sender")]
        for index, state in enumerate(senders):
            if type(state) is not SenderState:
                raise RclcError(
                    f"sender: item {index} is {type(state).__name__}; expected rclc.SenderState or a bound rclc.Agent"
                )
        receivers = _listify(receiver, callable, "receiver")
        for index, target in enumerate(receivers):
            if not callable(target):
                raise RclcError(f"receiver: item {index} ({type(target).__name__}) is not callable")
        if not callable(selector):
            raise RclcError("selector: expected a callable selector(sender, request_ids, budget) -> positions")
        requests = _listify(request, lambda value: isinstance(value, (str, torch.Tensor)), "request")
        for index, item in enumerate(requests):
            if not isinstance(item, (str, torch.Tensor)):
                raise RclcError(f"request: item {index} is {type(item).__name__}; expected text or int64 IDs [1, n]")
        if representation not in REPRESENTATIONS:
            raise RclcError(f"representation: {representation!r} is not one of {REPRESENTATIONS}")
        for state in senders:
            state.validate()
            if representation == "token_ids+continuous" and state.token_ids is None:
                raise RclcError("representation: token_ids+continuous needs token_ids on every sender")
        if exclusion is not None:
            exclusion.check_senders([state.positions for state in senders])
        starts = check_span_starts_option(span_starts, [state.positions for state in senders])
        plans: dict[tuple[int, int], PreparedRequest] = {}
        for k, target in enumerate(receivers):
            if isinstance(target, HFReceiver):
                for state in senders:
                    target.validate_sender(state)
                for r, item in enumerate(requests):
                    plans[(k, r)] = target.prepare_request(item)
        return _Snapshot(senders, receivers, requests, plans, starts)


def _fit_request(
    snapshot: _Snapshot, states: list[SenderState], request_index: int, policy: BudgetPolicy, builtin: bool, reserve: int
) -> list[int]:
    caps = [policy.cap(s.positions, s.inherited_positions, reserve) for s in states]
    floors = [floor(builtin=builtin, latent_steps=s.latent_steps, reserve=reserve) for s in states]
    room = [plan.available_positions for (_, r), plan in snapshot.plans.items() if r == request_index]
    return fit(caps, floors, min(room) if room else None)


def _tokenize(snapshot: _Snapshot) -> list[list[torch.Tensor]]:
    return [[state.request_ids(item) for item in snapshot.requests] for state in snapshot.senders]


def _select(
    state: SenderState,
    ids: torch.Tensor,
    count: int,
    selector: Any,
    exclude: list[str | None] | None = None,
    profile: SpanProfile | None = None,
    span_starts: Sequence[int] | None = None,
    fold: SupportFold | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
    """Run the selector (or keep from its precomputed `profile`, for pooled allocation) and
    gather the kept rows in ascending source order (worker thread; no lock: the state is
    read only, and concurrent transfers' built-in selections run at once; a user's selector
    takes the process-wide user-code turn unless declared `rclc.thread_safe`). `span_starts` goes
    to selectors that take it (the built-in span selectors); others cut spans their own way.
    `fold`: this sender's request fold, captured with the other senders' (`prefetch_folds`)."""
    if profile is not None:
        positions: Any = profile.keep(count)
    else:
        extra: dict[str, Any] = {}
        if exclude is not None:
            extra["exclude"] = exclude
        if span_starts is not None and accepts_keyword(selector, "span_starts"):
            extra["span_starts"] = span_starts
        with offering([] if fold is None else [(state, ids, fold)]), user_code_turn(selector, builtin=is_builtin(selector)):
            positions = selector(state, ids, count, **extra)
    index = validate_positions(positions, count, state.positions, selector_name(selector))
    index = index.to(state.input_embeds.device)
    rows = state.input_embeds.index_select(0, index)
    kept_ids = None if state.token_ids is None else state.token_ids.index_select(0, index.to(state.token_ids.device))
    return rows, kept_ids, index.tolist()


def _encode(
    state: SenderState, rows: torch.Tensor, ids: torch.Tensor | None, representation: str
) -> Message:
    rows = rows.detach()
    if representation == "embeddings":
        return Message(rows.to("cpu").contiguous())
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


async def _prepare_message(
    state: SenderState,
    ids: torch.Tensor,
    count: int,
    *,
    selector: Any,
    representation: str,
    reasoning: ReasoningOptions | None,
    record_selection: bool,
    exclude: list[str | None] | None = None,
    profile: SpanProfile | None = None,
    allocation: str = "per_sender",
    cap: int | None = None,
    span_starts: Sequence[int] | None = None,
    fold: SupportFold | None = None,
) -> Message:
    reserve = reasoning.reserve if reasoning else 0
    rows, kept_ids, indices = await run_in_worker(
        _select, state, ids, count - reserve, selector, exclude, profile, span_starts, fold
    )
    added = 0
    if reasoning is not None and not reasoning.before_selection:
        chosen = await run_in_worker(selected_state, state, rows, kept_ids)
        request = ids if reasoning.with_request else None
        extended = await apply_reasoning(
            reasoning.method,
            chosen,
            maximum=reserve,
            request_ids=request,
            request_positions=0 if request is None else int(request.shape[1]),
        )
        added = extended.positions - chosen.positions
        rows, kept_ids = extended.input_embeds, extended.token_ids

    def encode() -> Message:
        message = _encode(state, rows, kept_ids, representation)
        if not record_selection:
            return message
        record = build_selection(
            total=state.positions,
            indices=indices,
            budget=count,
            latent_steps=state.latent_steps,
            token_ids=state.token_ids,
            tokenizer=state.tokenizer,
            added_latent_positions=added,
            excluded=exclude,
            allocation=allocation,
            cap=count if cap is None else cap,
        )
        return Message(message.continuous_rows, message.token_ids, record)

    return await run_in_worker(encode)


async def _deliver(snapshot: _Snapshot, deliveries: list[Delivery]) -> None:
    for r, delivery in enumerate(deliveries):
        for k, target in enumerate(snapshot.receivers):
            plan = snapshot.plans.get((k, r))
            if plan is not None:
                target._enqueue(delivery, plan)
                continue
            result = target(delivery)
            if inspect.isawaitable(result):
                await result


async def transfer(
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
    where the scores are highest across them (rclc.selectors._pooling). `span_starts` (one
    entry per sender: None, or positions where a run of its rows begins, such as the joins
    between rows inherited from different hops) also cut the built-in selectors'
    text-aligned spans, so no span straddles two runs. Returns None after delivering.
    """
    options = reasoning_options(reasoning, reasoning_context, reasoning_budget)
    policy = BudgetPolicy.from_options(ratio, budget)
    selector = cacheback if selector is None else selector
    require_bool("record_selection", record_selection)
    exclusion = check_receiver_aware(exclude, allocation, selector)
    snapshot = await run_in_worker(
        _snapshot, sender, receiver, request, selector, representation, exclusion, span_starts
    )
    starts = snapshot.span_starts or [None] * len(snapshot.senders)
    builtin = is_builtin(selector)
    reserve = options.reserve if options else 0
    fits_now = options is None or not options.before_selection
    planned = (
        [_fit_request(snapshot, snapshot.senders, r, policy, builtin, reserve) for r in range(len(snapshot.requests))]
        if fits_now
        else []
    )
    request_ids = await run_in_worker(_tokenize, snapshot)
    states = list(snapshot.senders)
    if options is not None and options.context == "full":
        for i, state in enumerate(states):
            longest = max(int(ids.shape[1]) for ids in request_ids[i])
            states[i] = await apply_reasoning(
                options.method, state, maximum=options.budget, request_ids=None, request_positions=longest
            )
    deliveries = []
    for r, item in enumerate(snapshot.requests):
        request_states = states
        if options is not None and options.context == "full_with_request":
            request_states = []
            for i, state in enumerate(states):
                ids = request_ids[i][r]
                request_states.append(
                    await apply_reasoning(
                        options.method, state, maximum=options.budget, request_ids=ids, request_positions=int(ids.shape[1])
                    )
                )
        counts = planned[r] if fits_now else _fit_request(snapshot, request_states, r, policy, builtin, 0)
        masks: list[list[str | None] | None] = [None] * len(request_states)
        if exclusion is not None:
            receiver_prompts = [
                (snapshot.receivers[k].tokenizer, plan.input_ids) for (k, q), plan in snapshot.plans.items() if q == r
            ]
            masks = await run_in_worker(request_masks, request_states, item, receiver_prompts, exclusion)
        profiles: list[SpanProfile | None] = [None] * len(request_states)
        caps = list(counts)
        requests = [request_ids[i][r] for i in range(len(request_states))]
        if allocation == "pooled" and len(request_states) > 1:
            profiles, counts = await run_in_worker(
                pool, request_states, requests, counts, reserve, selector, masks, starts
            )
        folds: list[SupportFold | None] = [None] * len(request_states)
        if allocation != "pooled" and len(request_states) > 1:
            scoring = [counts[i] - reserve < state.positions for i, state in enumerate(request_states)]
            folds = await run_in_worker(prefetch_folds, selector, request_states, requests, scoring)
        messages = []
        for i, state in enumerate(request_states):
            messages.append(
                await _prepare_message(
                    state,
                    requests[i],
                    counts[i],
                    selector=selector,
                    representation=representation,
                    reasoning=options,
                    record_selection=record_selection,
                    exclude=masks[i],
                    profile=profiles[i],
                    allocation=allocation,
                    cap=caps[i],
                    span_starts=starts[i],
                    fold=folds[i],
                )
            )
        deliveries.append(Delivery(item, tuple(messages)))
    await _deliver(snapshot, deliveries)


def transfer_sync(sender: Any, receiver: Any, request: Any, **options: Any) -> None:
    """`transfer` from synchronous code (async callbacks still work). Inside a running event
    loop (a Jupyter cell) it runs on a loop of its own in a worker thread (`rclc.call_sync`);
    from async code, `await rclc.transfer(...)` is the better call."""
    call_sync(transfer, sender, receiver, request, **options)
