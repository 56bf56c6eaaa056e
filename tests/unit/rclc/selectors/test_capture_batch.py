"""A fan-in's captures in one batched forward (`capture_each`, `request_folds`) and the
transfer's use of them: each fold is what a capture of its sender alone gives."""

from __future__ import annotations

import threading

import pytest
import torch

import rclc
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
import rclc.selectors._receiver_aware as receiver_aware
from rclc.selectors import transfer_steps
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors import _attention_capture as _capture
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors import _prefetch, _shared_capture, _support, cacheback, qsnap
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors._attention_capture import capture, capture_each, reachable_configs
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._support import SupportFold, offering, request_fold, request_folds
from tests.helpers.agents import counted_forwards
from tests.helpers.selector_inputs import make_sender, request

OTHER = "Birch is owned by Bob. It launched in Lima on 9 June 2019, two years before Cedar."
SHORT = "Cedar: Alice."


def senders(model, tokenizer):
    """Three senders of different lengths (so the batch pads)."""
    return [make_sender(model, tokenizer), make_sender(model, tokenizer, OTHER), make_sender(model, tokenizer, SHORT)]


def requests(tokenizer):
    """Requests of different lengths (so the batch pads them too)."""
    return [request(tokenizer), request(tokenizer, "Who owns Birch?"), request(tokenizer, "Owner of Cedar, and where?")]


def recorded(calls):
    def fold(query, key, scaling):
        calls.append((query.clone(), key.clone(), scaling))

    return fold


def test_each_element_sees_what_its_own_capture_sees(tiny):
    model, tokenizer = tiny
    states, ids = senders(model, tokenizer), requests(tokenizer)
    alone = [[] for _ in states]
    for state, request_ids, calls in zip(states, ids, alone):
        capture(model, state.past_key_values, recorded(calls), state.positions, input_ids=request_ids)
    batched = [[] for _ in states]
    with counted_forwards(model) as forwards:
        capture_each(
            model,
            [(state.past_key_values, state.positions, request_ids, recorded(calls))
             for state, request_ids, calls in zip(states, ids, batched)],
        )
    # One forward of the requests packed one after another: no row is padding.
    assert forwards == [sum(int(request_ids.shape[1]) for request_ids in ids)]
    assert len({int(request_ids.shape[1]) for request_ids in ids}) > 1  # lengths differ, so padding would show
    for one, many, state, request_ids in zip(alone, batched, states, ids):
        assert len(many) == len(one) == model.config.num_hidden_layers
        for (q1, k1, s1), (q2, k2, s2) in zip(one, many):
            assert q2.shape == q1.shape == (1, model.config.num_attention_heads, request_ids.shape[1], model.config.head_dim)
            assert k2.shape == k1.shape and k1.shape[2] == state.positions + request_ids.shape[1]
            assert s1 == s2
            torch.testing.assert_close(q2, q1, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(k2, k1, rtol=1e-5, atol=1e-5)


def test_batched_folds_match_folds_alone_and_leave_everything_as_it_was(tiny):
    model, tokenizer = tiny
    states, ids = senders(model, tokenizer), requests(tokenizer)
    caches = [[(k.clone(), v.clone()) for k, v in cache_layers(s.past_key_values)] for s in states]
    alone = [request_fold(state, request_ids, moments=True) for state, request_ids in zip(states, ids)]
    together = request_folds(states, ids)
    for one, many in zip(alone, together):
        torch.testing.assert_close(many.votes_mean(), one.votes_mean(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(many.energy, one.energy, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(many.row_energy, one.row_energy, rtol=1e-4, atol=1e-6)
    for state, before in zip(states, caches):
        for (k, v), (k0, v0) in zip(cache_layers(state.past_key_values), before):
            assert torch.equal(k, k0) and torch.equal(v, v0)
    assert all(c._attn_implementation == "sdpa" for c in reachable_configs(model))
    assert _capture.active_captures() == ()


def test_a_batched_capture_serves_other_threads_forwards_unchanged(tiny):
    """While a batched capture runs, a plain forward of the model elsewhere is untouched."""
    model, tokenizer = tiny
    states, ids = senders(model, tokenizer), requests(tokenizer)
    plain_ids = request(tokenizer)
    expected = model(plain_ids).logits
    seen = []

    def fold(query, key, scaling):
        if not seen:
            out = []
            thread = threading.Thread(target=lambda: out.append(model(plain_ids).logits))
            thread.start()
            thread.join()
            seen.append(out[0])

    capture_each(model, [(s.past_key_values, s.positions, i, fold) for s, i in zip(states, ids)])
    assert seen and torch.equal(seen[0], expected)


def test_offered_fold_is_used_only_for_its_sender_and_request(tiny):
    model, tokenizer = tiny
    first, second = senders(model, tokenizer)[:2]
    ids = request(tokenizer)
    offered = SupportFold(moments=True)
    with offering([(first, ids, offered)]):
        assert request_fold(first, ids.clone(), moments=True) is offered
        assert request_fold(first, ids, moments=False) is offered  # moments also serve votes
        assert request_fold(second, ids, moments=True) is not offered
        assert request_fold(first, request(tokenizer, "Who owns Birch?"), moments=True) is not offered
    assert request_fold(first, ids, moments=True) is not offered
    votes_only = SupportFold(moments=False)
    with offering([(first, ids, votes_only)]):
        assert request_fold(first, ids, moments=True) is not votes_only  # votes cannot serve moments


def test_prefetch_captures_only_senders_that_score(tiny):
    model, tokenizer = tiny
    states, ids = senders(model, tokenizer), requests(tokenizer)
    assert _prefetch.prefetch_folds(lambda s, i, b: list(range(b)), states, ids, [True] * 3) == [None] * 3
    folds = _prefetch.prefetch_folds(cacheback, states, ids, [True, False, True])
    assert folds[1] is None and folds[0] is not None and folds[2] is not None
    assert _prefetch.prefetch_folds(qsnap, states, ids, [True, False, False]) == [None] * 3  # one alone: nothing to share
    too_long = torch.zeros(1, model.config.max_position_embeddings, dtype=torch.long)
    left = _prefetch.prefetch_folds(cacheback, states, [ids[0], too_long, ids[2]], [True] * 3)
    assert left[1] is None and left[0] is not None  # the selector reports the bad request itself


@pytest.mark.parametrize("selector", ["cacheback", "qsnap"])
@pytest.mark.parametrize("allocation", ["per_sender", "pooled"])
def test_a_fan_in_transfer_captures_once_and_selects_as_one_by_one(tiny, selector, allocation, monkeypatch):
    model, tokenizer = tiny
    chosen = rclc.selectors.BUILTIN[selector]
    states = senders(model, tokenizer)
    question = "Who owns Cedar and when did it launch?"

    def run():
        received = []
        rclc.transfer_sync(
            states, lambda delivery: received.append(delivery), question, ratio=2, selector=chosen,
            allocation=allocation, record_selection=True,
        )
        return [message.selection.indices for message in received[0].messages]

    sizes = []  # senders per capture forward
    original = _shared_capture.capture_each

    def counting(model, items):
        sizes.append(len(items))
        return original(model, items)

    monkeypatch.setattr(_shared_capture, "capture_each", counting)
    batched = run()
    assert sizes == [3]

    def nothing(selector, states, ids, scoring):
        return [None] * len(states)

    monkeypatch.setattr(transfer_steps, "prefetch_folds", nothing)  # every selection captures alone
    monkeypatch.setattr(receiver_aware, "prefetch_folds", nothing)
    sizes.clear()
    assert run() == batched
    assert sizes == [1, 1, 1]  # each selection captured its sender alone


def test_a_failing_fold_in_a_batch_restores_the_model(tiny):
    model, tokenizer = tiny
    states, ids = senders(model, tokenizer), requests(tokenizer)

    def failing(query, key, scaling):
        raise RuntimeError("fold failed")

    folds = [lambda q, k, s: None, failing, lambda q, k, s: None]
    with pytest.raises(RuntimeError, match="fold failed"):
        capture_each(model, [(s.past_key_values, s.positions, i, f) for s, i, f in zip(states, ids, folds)])
    assert all(c._attn_implementation == "sdpa" for c in reachable_configs(model))
    assert _capture.active_captures() == ()
    bad = torch.zeros(1, 0, dtype=torch.long)
    with pytest.raises(rclc.RclcError, match="input_ids"):
        capture_each(model, [(s.past_key_values, s.positions, bad, folds[0]) for s in states])
