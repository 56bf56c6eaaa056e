"""Property tests over the combinations of `rclc.transfer`'s options (issue 24): 1-3 senders,
1-3 requests, 1-2 receivers, ratio or budget, every `exclude` reason set, both allocations,
every span kind, every reasoning context, both representations, `record_selection`.

What must hold for every combination (docs/api.md, the seed's spec):
- a transfer either delivers or raises a ValueError (RclcError) naming the field, and then
  delivers nothing;
- each receiver gets one delivery per request, in request order, each with one message per
  sender in sender order;
- the kept counts follow the budget formula (`BudgetPolicy.cap`: I + ceil((T - I) / r) or
  min(B, T)), with reasoning's rows where its context puts them, and a pooled group spends
  the same total as its senders' caps;
- a recorded selection lists exactly the kept sender positions (plus latent rows it added);
- no sender's rows, token IDs or cache change.

Examples are drawn from a fixed seed (`derandomize`), so every CI run tries the same ones.
"""

from __future__ import annotations

import functools
import warnings

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import rclc
from rclc import Exclusion, HFReceiver, RclcError, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers
from rclc.policy import EXCLUSION_REASONS, REASONING_CONTEXTS, SPAN_KINDS, BudgetPolicy
from rclc.selectors import cacheback, chunkkv, qsnap, recent

DOCUMENTS = [
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. It has twelve staff.",
    "Bob owns the Birch project.\nIt started in Lima in June 2019.\n\nA second paragraph follows here.",
    "Question: who owns Cedar? The Pine project belongs to Carol. Carol lives in Rome; she founded it.",
]
REQUESTS = ["Who owns the Cedar project?", "Where did Birch start?", "Who is Carol?"]
SELECTORS = {"cacheback": cacheback, "qsnap": qsnap, "chunkkv": chunkkv, "recent": recent}
SPAN_SELECTORS = ("cacheback", "qsnap", "chunkkv")

options = st.fixed_dictionaries({
    "senders": st.integers(1, 3),
    "requests": st.integers(1, 3),
    "receivers": st.lists(st.sampled_from(["hf", "callback"]), min_size=1, max_size=2),
    "budget": st.one_of(st.tuples(st.just("ratio"), st.integers(1, 8)), st.tuples(st.just("budget"), st.integers(1, 40))),
    "exclude": st.one_of(st.none(), st.sets(st.sampled_from(EXCLUSION_REASONS)).map(lambda reasons: tuple(sorted(reasons)))),
    "allocation": st.sampled_from(["per_sender", "pooled"]),
    "selector": st.sampled_from(sorted(SELECTORS)),
    "span": st.sampled_from(SPAN_KINDS),
    "reasoning": st.one_of(st.none(), st.tuples(st.sampled_from(REASONING_CONTEXTS), st.integers(1, 3))),
    "representation": st.sampled_from(["embeddings", "token_ids+continuous"]),
    "record_selection": st.booleans(),
})


def _sender(model, tokenizer, text):
    return rclc.sender_from_hf(model, tokenizer, text)


def _frozen(state):
    return (state.input_embeds.clone(), None if state.token_ids is None else state.token_ids.clone(),
            [(keys.clone(), values.clone()) for keys, values in cache_layers(state.past_key_values)],
            state.positions, state.inherited_positions, state.latent_steps)


def _same(state, before) -> bool:
    rows, ids, layers, positions, inherited, latent = before
    return (torch.equal(state.input_embeds, rows) and (ids is None or torch.equal(state.token_ids, ids))
            and (state.positions, state.inherited_positions, state.latent_steps) == (positions, inherited, latent)
            and all(torch.equal(k, k0) and torch.equal(v, v0)
                    for (k, v), (k0, v0) in zip(cache_layers(state.past_key_values), layers)))


def _arguments(case):
    selector = SELECTORS[case["selector"]]
    if case["selector"] in SPAN_SELECTORS:
        selector = functools.partial(selector, span=case["span"])
    kind, value = case["budget"]
    arguments = {kind: value, "selector": selector, "allocation": case["allocation"],
                 "representation": case["representation"], "record_selection": case["record_selection"]}
    if case["exclude"] is not None:
        arguments["exclude"] = Exclusion(reasons=case["exclude"])
    if case["reasoning"] is not None:
        context, steps = case["reasoning"]
        arguments.update(reasoning=functools.partial(rclc.latent_mass, steps=steps), reasoning_context=context,
                         reasoning_budget=steps)
    return arguments


def _count_bounds(case, state) -> tuple[int, int]:
    """The least and most positions the formula lets one sender's message hold (per_sender)."""
    kind, value = case["budget"]
    policy = BudgetPolicy.from_options(**{kind: value})
    if case["reasoning"] is None:
        cap = policy.cap(state.positions, state.inherited_positions)
        return cap, cap
    context, steps = case["reasoning"]
    if context.startswith("full"):  # reasoning first adds up to `steps` rows, then the cap applies
        return policy.cap(state.positions, state.inherited_positions), policy.cap(state.positions + steps,
                                                                                  state.inherited_positions)
    cap = policy.cap(state.positions, state.inherited_positions, steps)  # rows reserved after selection
    return cap - steps, cap


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=options)
def test_every_combination_delivers_by_the_formula_or_refuses_cleanly(tiny_qwen3, case):  # issue 24 properties
    model, tokenizer = tiny_qwen3
    senders = [_sender(model, tokenizer, DOCUMENTS[index]) for index in range(case["senders"])]
    requests = REQUESTS[: case["requests"]]
    before = [_frozen(state) for state in senders]
    called: list[list] = []
    receivers = []
    for kind in case["receivers"]:
        if kind == "hf":
            receivers.append(HFReceiver(model, tokenizer, max_new_tokens=2))
        else:
            got: list = []
            called.append(got)
            receivers.append(got.append)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # token_ids+continuous says it is experimental
        try:
            transfer_sync(senders, receivers, requests, **_arguments(case))
        except RclcError as error:  # a combination the core refuses: named, and nothing delivered
            assert str(error) and ":" in str(error)
            assert all(len(receiver) == 0 for receiver in receivers if isinstance(receiver, HFReceiver))
            assert all(got == [] for got in called)
            assert all(_same(state, snap) for state, snap in zip(senders, before))
            return
    assert all(_same(state, snap) for state, snap in zip(senders, before)), "a sender changed"
    deliveries = [[receiver.peek(index)[0] for index in range(len(receiver))] if isinstance(receiver, HFReceiver)
                  else None for receiver in receivers]
    callbacks = iter(called)
    for index, receiver in enumerate(receivers):
        got = deliveries[index] if deliveries[index] is not None else next(callbacks)
        assert [delivery.request for delivery in got] == requests
        assert all(len(delivery.messages) == len(senders) for delivery in got)
    reference = deliveries[0] if deliveries[0] is not None else called[0]
    for delivery in reference:
        kept = [message.positions for message in delivery.messages]
        bounds = [_count_bounds(case, state) for state in senders]
        if case["allocation"] == "pooled" and len(senders) > 1:  # the group's total, spent where it scores best
            assert sum(low for low, _ in bounds) <= sum(kept) <= sum(high for _, high in bounds), (kept, bounds)
            if case["reasoning"] is None:
                assert sum(kept) == sum(high for _, high in bounds)
        else:
            for count, (low, high) in zip(kept, bounds):
                assert low <= count <= high, (kept, bounds, case)
        for message, state in zip(delivery.messages, senders):
            selection = message.selection
            if not case["record_selection"]:
                assert selection is None
                continue
            indices = list(selection.indices)
            assert indices == sorted(set(indices)) and all(0 <= i < selection.source_positions for i in indices)
            assert len(indices) + selection.added_latent_positions == message.positions
    for other in deliveries[1:]:  # every receiver got the same messages
        if other is None:
            continue
        for mine, theirs in zip(reference, other):
            assert [m.positions for m in mine.messages] == [m.positions for m in theirs.messages]


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=options)
def test_the_llama_family_holds_the_same_invariants(tiny_llama, case):  # issue 24 properties
    test_every_combination_delivers_by_the_formula_or_refuses_cleanly.hypothesis.inner_test(tiny_llama, case)
