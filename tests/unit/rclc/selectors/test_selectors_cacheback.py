"""CacheBack and QSnap: scores against independent references, guards and errors."""

from __future__ import annotations

import importlib
import weakref

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rclc.selectors import cacheback, cacheback_scores, qsnap, qsnap_scores
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors import _support
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors._attention_capture import capture
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._support import SupportFold, composite_score, correction
from tests.helpers.selector_inputs import (
    LiteralSupportFold,
    eager_attentions,
    eager_copy,
    make_sender,
    max_pool_reference,
    request,
    support_reference,
)

# The package re-exports the functions under their module names, so reach the modules explicitly.
cacheback_module = importlib.import_module("rclc.selectors.cacheback")
qsnap_module = importlib.import_module("rclc.selectors.qsnap")

TOLERANCE = {"rtol": 2e-5, "atol": 1e-7}


@pytest.fixture(scope="module")
def eager_models():
    # Keyed by the model itself, weakly: the session's `tiny` is rebuilt whenever pytest switches
    # its family, and a new model may reuse a freed one's id() (issue 24: a Llama was once
    # compared against the eager copy of a freed Qwen3 that had the same id).
    return weakref.WeakKeyDictionary()


def reference_for(model, sender, ids, eager_models):
    if model not in eager_models:
        eager_models[model] = eager_copy(model)
    attentions = eager_attentions(eager_models[model], sender.past_key_values, sender.positions, input_ids=ids)
    return support_reference(attentions, model.config.num_key_value_heads, sender.positions)


@pytest.mark.parametrize("question", ["Who owns Cedar and when did it launch?", "Lima"])
def test_cacheback_scores_match_the_eager_reference(tiny, eager_models, question):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer, question)
    reference = reference_for(model, sender, ids, eager_models)
    torch.testing.assert_close(cacheback_scores(sender, ids), reference["score"], **TOLERANCE)


def test_qsnap_scores_match_the_eager_reference(tiny, eager_models):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    reference = reference_for(model, sender, ids, eager_models)
    torch.testing.assert_close(qsnap_scores(sender, ids), max_pool_reference(reference["snap"]), **TOLERANCE)


def test_fold_is_bit_identical_to_the_literal_arithmetic(tiny):
    """The grouped bmm of SupportFold reproduces the expanded-key matmul of section 4.2 exactly."""
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    fast, literal = SupportFold(), LiteralSupportFold()

    class Both:  # both folds see the same queries and keys (the fast one computes the layer outputs)
        def __call__(self, query, key, scaling):
            fast(query, key, scaling)
            literal(query, key, scaling)

        def attend(self, query, key, value, scaling):
            literal(query, key, scaling)
            return fast.attend(query, key, value, scaling)

    with torch.inference_mode():
        capture(model, sender.past_key_values, Both(), sender.positions, input_ids=ids)
    assert torch.equal(fast.votes, literal.votes)
    assert torch.equal(fast.energy, literal.energy)
    assert torch.equal(fast.row_energy, literal.row_energy)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([(4, 2), (6, 3), (4, 4), (8, 2)]),
    st.integers(1, 40),
    st.integers(1, 60),
    st.integers(0, 2**31 - 1),
    st.floats(0.1, 8.0),
)
def test_fold_matches_literal_on_random_tensors_with_chunking(heads, rows, memory, seed, temperature):
    """Row chunking (forced small here) and the causal offsets agree with the literal fold;
    and the support correction never shrinks a score (ratio >= 1)."""
    query_heads, kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, query_heads, rows, 8, generator=generator) * temperature
    key = torch.randn(1, kv_heads, memory + rows, 8, generator=generator)
    literal = LiteralSupportFold(row_chunk=256)
    literal(query, key, 8**-0.5)
    original = _support.ROW_CHUNK
    _support.ROW_CHUNK = 7
    try:
        fold = SupportFold()
        fold(query, key, 8**-0.5)
    finally:
        _support.ROW_CHUNK = original
    torch.testing.assert_close(fold.votes, literal.votes, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fold.energy, literal.energy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fold.row_energy, literal.row_energy, rtol=1e-5, atol=1e-6)
    ratio = correction(fold.row_energy, fold.energy)
    assert bool((ratio >= 1 - 1e-5).all())


def test_ratio_is_at_least_one_on_models(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    for question in ["Who owns Cedar?", "launched in Oslo on 3 May", "Bob"]:
        fold = SupportFold()
        with torch.inference_mode():
            capture(model, sender.past_key_values, fold, sender.positions, input_ids=request(tokenizer, question))
        ratio = correction(fold.row_energy, fold.energy)
        assert bool((ratio >= 1 - 1e-5).all())
        assert torch.equal(composite_score(fold), _support.pool7(fold.votes_mean()) * ratio**2)


def test_correction_limits():
    row_energy = torch.tensor([0.0, 0.0, 2.0, 1e-30])
    energy = torch.tensor([0.0, 1.0, 0.0, 1.0])
    ratio = correction(row_energy, energy)
    tiny = torch.finfo(torch.float32).tiny
    assert ratio[0] == 1.0  # neutral 0/0
    assert ratio[1] == tiny  # clamped from below
    assert ratio[2] == 2.0 / tiny
    assert ratio[3] == torch.tensor(1e-30)


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_selection_keeps_budget_first_and_latent_tail(tiny, selector):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=3)
    total = sender.positions
    for budget in (4, 9, total - 1):
        kept = selector(sender, request(tokenizer), budget)
        assert len(kept) == budget and kept == sorted(set(kept))
        assert {0, total - 3, total - 2, total - 1} <= set(kept)


def test_cacheback_selection_equals_keep_of_reference_scores(tiny, eager_models):
    from rclc.selectors import fixed_span_keep

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    literal = LiteralSupportFold()
    with torch.inference_mode():
        capture(model, sender.past_key_values, literal, sender.positions, input_ids=ids)
    votes = literal.votes / (literal.heads * literal.rows)
    scores = max_pool_reference(votes) * correction(literal.row_energy, literal.energy) ** 2
    for budget in (5, 12, 20):
        assert cacheback(sender, ids, budget, span_size=4) == fixed_span_keep(scores, budget, 4)


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_sender_state_unchanged_after_selection(tiny, selector):
    from tests.helpers.selector_inputs import assert_unchanged, snapshot

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=2)
    before = snapshot(sender)
    selector(sender, request(tokenizer), 6)
    assert_unchanged(sender, before)


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_early_exit_runs_no_forward(tiny, selector, monkeypatch):
    # private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
    from rclc.selectors import _attention_capture as _capture

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    calls = []
    monkeypatch.setattr(_capture, "forward_rows", lambda *a, **k: calls.append(1))
    # A request far beyond the context limit does not matter when nothing needs selecting.
    huge = torch.zeros(1, model.config.max_position_embeddings, dtype=torch.int64)
    assert selector(sender, huge, sender.positions) == list(range(sender.positions))
    assert selector(sender, huge, sender.positions + 10) == list(range(sender.positions))
    assert calls == []


@pytest.mark.parametrize("selector", [cacheback, qsnap])
@pytest.mark.parametrize("span_size", [0, -1, 2.0, True, None])
def test_bad_span_size(tiny, selector, span_size):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    with pytest.raises(ValueError, match="span_size"):
        selector(sender, request(tokenizer), 4, span_size=span_size)


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_budget_below_latent_tail(tiny, selector):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=4)
    with pytest.raises(ValueError, match="budget.*latent"):
        selector(sender, request(tokenizer), 4)


@pytest.mark.parametrize("selector,name", [(cacheback, "CacheBack"), (qsnap, "QSnap")])
def test_context_limit(tiny, selector, name):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    limit = model.config.max_position_embeddings
    too_long = torch.zeros(1, limit - sender.positions + 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=f"{name}.*context limit"):
        selector(sender, too_long, 4)
    fits = torch.zeros(1, 3, dtype=torch.int64)
    assert len(selector(sender, fits, 4)) == 4


def test_non_finite_scores_raise_naming_the_selector(tiny, monkeypatch):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    nan = torch.full((sender.positions,), float("nan"))
    monkeypatch.setattr(cacheback_module, "composite_score", lambda fold: nan)
    with pytest.raises(RuntimeError, match="CacheBack"):
        cacheback(sender, request(tokenizer), 4)
    monkeypatch.setattr(qsnap_module, "pool7", lambda votes: votes * float("inf"))
    with pytest.raises(RuntimeError, match="QSnap"):
        qsnap(sender, request(tokenizer), 4)


def test_bad_request_ids(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    with pytest.raises(ValueError, match="request_ids"):
        cacheback(sender, torch.zeros(3, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="request_ids"):
        cacheback(sender, torch.zeros(1, 3, dtype=torch.int32), 4)


def test_nothing_folded_raises():
    with pytest.raises(RuntimeError, match="no global layer was folded"):
        SupportFold().votes_mean()
    fold = SupportFold(moments=False)
    fold(torch.randn(1, 4, 3, 8), torch.randn(1, 2, 10, 8), 8**-0.5)
    with pytest.raises(RuntimeError, match="moments"):
        composite_score(fold)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.sampled_from([(), (3,), (2, 4), (2, 1, 3)]), st.integers(0, 2**31 - 1))
def test_pool7_is_a_centred_window_max(length, leading, seed):
    values = torch.randn(*leading, length, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(_support.pool7(values), max_pool_reference(values))
