"""What `rclc.transfer` decides before any selector runs, as frozen values, one step each.

A transfer's work is: check the options (`TransferOptions`), resolve and check every input
under the preparation lock (`Handoff`), then, per request, plan the selection
(`RequestPlan`): fit the budgets, build the exclusion masks, bridge the request (a selector
bound with `bridge`), pool or prefetch the scores.
Only then do the selections run (rclc/pipeline.py), so a failure in any step delivers
nothing. Each step takes the values the previous ones made and returns a new one: no step
changes what another holds, and no name is reused for something else along the way (the
loose locals of one 100-line function did, which is how a list of budgets became a list of
receiver prompts and several requests with `exclude=` raised IndexError).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._arguments import require_bool
from ._locks import preparation_lock
from ._worker import run_in_worker
from .errors import RclcError
from .exclusion import Exclusion
from .policy import REASONING_CONTEXTS, REPRESENTATIONS, BudgetPolicy, fit, floor
from .reasoning import apply_reasoning
from .receiver import HFReceiver, PreparedRequest
from .selectors import cacheback, is_builtin, transfer_steps
from .state import SenderState


@dataclass(frozen=True)
class ReasoningOptions:
    """A transfer's reasoning arguments, checked: the method, where it runs, its row budget."""

    method: Callable[..., Any]
    context: str
    budget: int | None

    @classmethod
    def check(cls, reasoning: Any, context: Any, budget: Any) -> ReasoningOptions | None:
        """`reasoning=`, `reasoning_context=` and `reasoning_budget=` together (None: no reasoning)."""
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
        return cls(reasoning, context, budget)

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


@dataclass(frozen=True)
class TransferOptions:
    """Everything a transfer was asked to do besides its senders, receivers and requests,
    checked once before any model work."""

    policy: BudgetPolicy
    selector: Any
    representation: str
    reasoning: ReasoningOptions | None
    record_selection: bool
    exclusion: Exclusion | None  # None when nothing is excluded
    allocation: str

    @classmethod
    def check(cls, *, ratio: Any, budget: Any, selector: Any, representation: Any, reasoning: ReasoningOptions | None,
              record_selection: Any, exclude: Any, allocation: Any) -> TransferOptions:
        """The options of one `transfer` call; RclcError naming the first bad one."""
        policy = BudgetPolicy.from_options(ratio, budget)
        selector = cacheback if selector is None else selector
        if not callable(selector):
            raise RclcError("selector: expected a callable selector(sender, request_ids, budget) -> positions")
        require_bool("record_selection", record_selection)
        if representation not in REPRESENTATIONS:
            raise RclcError(f"representation: {representation!r} is not one of {REPRESENTATIONS}")
        exclusion = transfer_steps.check_receiver_aware(exclude, allocation, selector)
        return cls(policy, selector, representation, reasoning, record_selection, exclusion, allocation)

    @property
    def builtin(self) -> bool:
        return is_builtin(self.selector)

    @property
    def bridges(self) -> bool:
        """Whether the selector was bound with `bridge` > 0 (the transfer then bridges its senders)."""
        return transfer_steps.bridge_of(self.selector) > 0

    @property
    def reserve(self) -> int:
        return self.reasoning.reserve if self.reasoning else 0


@dataclass(frozen=True)
class Handoff:
    """The resolved inputs of one transfer: sender states (agents resolved), receivers,
    requests, each planned receiver's prompt per request, and each sender's run starts."""

    senders: tuple[SenderState, ...]
    receivers: tuple[Any, ...]
    requests: tuple[Any, ...]
    prompts: dict[tuple[int, int], PreparedRequest]  # (receiver index, request index) -> its planned prompt
    span_starts: tuple[tuple[int, ...] | None, ...]

    def receiver_prompts(self, request_index: int) -> list[tuple[Any, torch.Tensor]]:
        """(tokenizer, prompt ids) of every planned receiver of one request (what `known` reads)."""
        return [(self.receivers[k].tokenizer, prompt.input_ids) for (k, r), prompt in self.prompts.items()
                if r == request_index]

    def room(self, request_index: int) -> int | None:
        """The handoff positions the tightest planned receiver of one request has (None: unbounded)."""
        room = [prompt.available_positions for (_, r), prompt in self.prompts.items() if r == request_index]
        return min(room) if room else None


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


def _resolve_sender(item: Any) -> Any:
    if isinstance(item, SenderState):
        return item
    resolve = getattr(item, "sender_state", None)
    return resolve() if callable(resolve) else item


def _senders(sender: Any, options: TransferOptions) -> list[SenderState]:
    senders = [_resolve_sender(item) for item in _listify(sender, _is_sender_like, "sender")]
    for index, state in enumerate(senders):
        if type(state) is not SenderState:
            raise RclcError(f"sender: item {index} is {type(state).__name__}; expected rclc.SenderState or a bound rclc.Agent")
        state.validate()
        if options.representation == "token_ids+continuous" and state.token_ids is None:
            raise RclcError("representation: token_ids+continuous needs token_ids on every sender")
    if options.exclusion is not None:
        options.exclusion.check_senders([state.positions for state in senders])
    return senders


def _requests(request: Any) -> list[Any]:
    requests = _listify(request, lambda value: isinstance(value, (str, torch.Tensor)), "request")
    for index, item in enumerate(requests):
        if not isinstance(item, (str, torch.Tensor)):
            raise RclcError(f"request: item {index} is {type(item).__name__}; expected text or int64 IDs [1, n]")
    return requests


def resolve(sender: Any, receiver: Any, request: Any, options: TransferOptions, span_starts: Any) -> Handoff:
    """Resolve agents, validate every input and plan every planned receiver (worker, prep lock)."""
    with preparation_lock:
        senders = _senders(sender, options)
        receivers = _listify(receiver, callable, "receiver")
        for index, target in enumerate(receivers):
            if not callable(target):
                raise RclcError(f"receiver: item {index} ({type(target).__name__}) is not callable")
        requests = _requests(request)
        starts = transfer_steps.check_span_starts_option(span_starts, [state.positions for state in senders])
        prompts: dict[tuple[int, int], PreparedRequest] = {}
        for k, target in enumerate(receivers):
            if isinstance(target, HFReceiver):
                for state in senders:
                    target.validate_sender(state)
                for r, item in enumerate(requests):
                    prompts[(k, r)] = target.prepare_request(item)
        return Handoff(tuple(senders), tuple(receivers), tuple(requests), prompts,
                       tuple(starts) if starts is not None else (None,) * len(senders))


def fit_counts(handoff: Handoff, states: Sequence[SenderState], request_index: int, options: TransferOptions,
               reserve: int) -> list[int]:
    """Each sender's positions for one request: its cap by the budget formula, fitted to the
    tightest planned receiver (`rclc.policy.fit`); `reserve` rows held for reasoning."""
    caps = [options.policy.cap(s.positions, s.inherited_positions, reserve) for s in states]
    floors = [floor(builtin=options.builtin, latent_steps=s.latent_steps, reserve=reserve) for s in states]
    return fit(caps, floors, handoff.room(request_index))


def request_ids(handoff: Handoff) -> list[list[torch.Tensor]]:
    """Every request tokenized by every sender (`ids[sender][request]`; worker thread)."""
    return [[state.request_ids(item) for item in handoff.requests] for state in handoff.senders]


@dataclass(frozen=True)
class RequestPlan:
    """One request's selection work, decided before any selector runs.

    `states` are the senders as this request's selection sees them (after full-context
    reasoning); `counts` the positions each sender's message may hold (after pooling);
    `caps` the fitted counts before pooling (what a recorded selection calls its cap);
    `masks`, `profiles` and `folds` are per sender (None where not used; a bridged transfer's
    profiles hold its mixed scores, so the selections keep from them), `bridge` the bridge's
    text (None: no bridge) and `pooled` whether the counts came from pooling."""

    index: int
    request: Any
    states: tuple[SenderState, ...]
    ids: tuple[torch.Tensor, ...]
    bridge: str | None
    pooled: bool
    counts: tuple[int, ...]
    caps: tuple[int, ...]
    masks: tuple[list[str | None] | None, ...]
    profiles: tuple[Any, ...]  # SpanProfile | None
    folds: tuple[Any, ...]  # SupportFold | None
    starts: tuple[tuple[int, ...] | None, ...]


async def reasoned_states(states: Sequence[SenderState], options: TransferOptions, room: Sequence[int],
                          requests: Sequence[torch.Tensor] | None = None) -> list[SenderState]:
    """The senders after full-context reasoning: each leaves `room[i]` positions for its
    request, and reasons with `requests[i]` when given (`full_with_request`)."""
    reasoning = options.reasoning
    assert reasoning is not None
    reasoned = []
    for index, state in enumerate(states):
        reasoned.append(await apply_reasoning(
            reasoning.method, state, maximum=reasoning.budget,
            request_ids=None if requests is None else requests[index], request_positions=room[index]))
    return reasoned


async def plan_request(handoff: Handoff, options: TransferOptions, index: int, states: Sequence[SenderState],
                       ids: Sequence[torch.Tensor], fitted: Sequence[int]) -> RequestPlan:
    """fit -> masks -> (bridge) -> pooled or prefetched scores, for request `index` (model
    work in workers)."""
    count = len(states)
    request = handoff.requests[index]
    masks: list[list[str | None] | None] = [None] * count
    if options.exclusion is not None:
        masks = await run_in_worker(transfer_steps.request_masks, states, request,
                                    handoff.receiver_prompts(index), options.exclusion)
    pooling = options.allocation == "pooled" and count > 1
    counts, profiles, folds = list(fitted), [None] * count, [None] * count
    text, found = None, None
    if options.bridges:
        passed_over = await run_in_worker(transfer_steps.bridge_flags, states, request,
                                          handoff.receiver_prompts(index), options.exclusion)
        found = await run_in_worker(transfer_steps.bridge, states, ids, options.selector, masks, passed_over,
                                    handoff.span_starts)
    if found is not None:
        # bridged: every sender's mixed profile is already scored; pooling only moves counts
        text, profiles = found.text, list(found.profiles)
        if pooling:
            counts = transfer_steps.pool_profiles(found.profiles, fitted, options.reserve)
    elif pooling:
        profiles, counts = await run_in_worker(transfer_steps.pool, states, ids, fitted, options.reserve,
                                               options.selector, masks, handoff.span_starts)
    elif count > 1:
        scoring = [fitted[i] - options.reserve < state.positions for i, state in enumerate(states)]
        folds = await run_in_worker(transfer_steps.prefetch_folds, options.selector, states, ids, scoring)
    return RequestPlan(index, request, tuple(states), tuple(ids), text, pooling, tuple(counts),
                       tuple(fitted), tuple(masks), tuple(profiles), tuple(folds), handoff.span_starts)
