"""Pooled fan-in budgets: the joint ranking across senders, its comparability, and the transfer option."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rclc import Exclusion, HFReceiver, transfer_sync
from rclc.selectors import cacheback, keep_spans, qsnap, random_selector, recent
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._common import SpanOptions, SpanProfile
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._pooling import comparable, pooled_counts, scoring_selector
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._spans import span_means
from tests.helpers.selector_inputs import make_sender


def profile(values, spans, excluded=None, latent=0):
    return SpanProfile(torch.tensor(values, dtype=torch.float32), spans, excluded, latent)


def sentences(total, size):
    return [(start, min(start + size, total)) for start in range(0, total, size)]


def test_a_sender_whose_best_sentence_stands_out_wins_budget():
    # Both senders: 20 positions in sentences of 4. A holds the evidence (6.0) and a related
    # sentence (3.0); B's sentences all score alike. Per sender each would keep 6; pooled, A
    # takes more, and its evidence sentence is kept whole.
    holder = profile([1.0] * 8 + [6.0] * 4 + [3.0] * 4 + [1.0] * 4, sentences(20, 4))
    other = profile([1.2] * 20, sentences(20, 4))
    counts = pooled_counts([holder, other], [6, 6])
    assert sum(counts) == 12 and counts[0] > counts[1]
    assert set(range(8, 12)) <= set(holder.keep(counts[0]))


def test_a_longer_senders_thinner_spread_is_undone():
    # The same attention pattern over twice the positions, at half the score per position
    # (a softmax spread over a longer state), ranks exactly as the short one does.
    pattern = [0.5, 2.0, 0.7, 1.1, 0.9]
    short = profile([v for v in pattern for _ in range(4)], sentences(20, 4))
    long = profile([v / 2 for v in pattern for _ in range(8)], sentences(40, 8))

    def ranked(p):
        shift, scale = comparable(p)
        return [(float(m) - shift) / scale for m in span_means(p.scores.float(), p.spans)]

    assert ranked(short) == pytest.approx(ranked(long))
    assert ranked(short) == pytest.approx([20 * v for v in pattern])  # 1 = a uniform spread


def test_excluded_spans_come_last_across_senders():
    first = profile([9.0] * 6 + [1.0] * 6, [(0, 6), (6, 12)], excluded=[True] * 6 + [False] * 6)
    second = profile([1.0] * 12, [(0, 6), (6, 12)])
    counts = pooled_counts([first, second], [4, 4])
    kept = first.keep(counts[0])
    assert all(position == 0 or position >= 6 for position in kept)


def test_budgets_that_cover_everything_keep_everything():
    first, second = profile([1.0] * 5, [(0, 5)]), profile([1.0] * 3, [(0, 3)])
    assert pooled_counts([first, second], [6, 3]) == [5, 3]


@st.composite
def pooled_cases(draw):
    senders = draw(st.integers(1, 4))
    profiles, counts = [], []
    for _ in range(senders):
        total = draw(st.integers(1, 30))
        cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
        bounds = [0, *cuts, total]
        values = draw(st.lists(st.floats(0.0, 10.0, width=32), min_size=total, max_size=total))
        latent = draw(st.integers(0, total - 1))
        excluded = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=total, max_size=total)))
        profiles.append(profile(values, list(zip(bounds, bounds[1:])), excluded, latent))
        counts.append(draw(st.integers(latent + 1, total)))
    return profiles, counts


@settings(max_examples=300, deadline=None)
@given(pooled_cases())
def test_pooled_counts_spend_the_total_and_keep_the_protected(case):
    profiles, counts = case
    pooled = pooled_counts(profiles, counts)
    assert sum(pooled) == sum(counts)
    for item, count in zip(profiles, pooled):
        assert len(item.protected) <= count <= item.positions
        kept = item.keep(count)
        assert len(kept) == count and set(item.protected) <= set(kept)


def test_only_scoring_selectors_pool():
    assert scoring_selector(cacheback) is not None
    assert scoring_selector(functools.partial(functools.partial(qsnap, span="line"), span="sentence"))[1] == {"span": "sentence"}
    assert scoring_selector(recent) is None and scoring_selector(random_selector(0)) is None
    assert scoring_selector(functools.partial(cacheback, object())) is None  # positional binding: not ours


# -- through transfer ------------------------------------------------------------------------

DOCUMENTS = (
    "The Cedar project is owned by Alice. The Birch project is owned by Bob. Find the owner.",
    "The annual report listed nothing. Most staff work in Oslo. The weather was mild and dry.",
)


def _pooled(model, tokenizer, senders, **options):
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(senders, receiver, "Who owns Cedar?", record_selection=True, **options)
    return [message.selection for message in receiver.peek(0)[0].messages]


def test_transfer_pools_the_fitted_total(tiny):
    model, tokenizer = tiny
    senders = [make_sender(model, tokenizer, text) for text in DOCUMENTS]
    per_sender = _pooled(model, tokenizer, senders, ratio=4)
    pooled = _pooled(model, tokenizer, senders, ratio=4, allocation="pooled")
    assert sum(s.budget for s in pooled) == sum(s.budget for s in per_sender)
    assert [s.cap for s in pooled] == [s.budget for s in per_sender]
    assert all(s.allocation == "pooled" and len(s.indices) == s.budget for s in pooled)
    inspected = pooled[0].inspect()
    assert inspected["allocation"] == "pooled" and inspected["cap"] == per_sender[0].budget
    # one sender: pooling has nothing to move
    alone = _pooled(model, tokenizer, senders[0], ratio=4, allocation="pooled")
    assert alone[0].indices == per_sender[0].indices


def test_pooled_selection_is_each_senders_keep_step(tiny):
    model, tokenizer = tiny
    senders = [make_sender(model, tokenizer, text) for text in DOCUMENTS]
    pooled = _pooled(model, tokenizer, senders, ratio=3, allocation="pooled",
                     selector=functools.partial(cacheback, span="sentence"), exclude=Exclusion(reasons=("known",)))
    for sender, selection in zip(senders, pooled):
        ids = sender.request_ids("Who owns Cedar?")
        mask = [span.excluded for span in selection.spans for _ in range(span.start, span.stop)]
        assert list(selection.indices) == cacheback(sender, ids, selection.budget, span="sentence", exclude=mask)


def test_pooled_needs_a_selector_with_scores(tiny):
    model, tokenizer = tiny
    senders = [make_sender(model, tokenizer, text) for text in DOCUMENTS]
    with pytest.raises(ValueError, match="allocation: 'pooled'.*selector recent has none"):
        _pooled(model, tokenizer, senders, ratio=4, allocation="pooled", selector=recent)
    with pytest.raises(ValueError, match="allocation: 'shared' is not one of"):
        _pooled(model, tokenizer, senders, ratio=4, allocation="shared")


def relevant_profile(values, spans, relevance, excluded=None):
    return SpanProfile(torch.tensor(values, dtype=torch.float32), spans, excluded, 0, relevance)


def test_relevance_keeps_less_when_less_is_relevant():
    # Sentences of 4: the second scores 6, the third 4, the others 1. At relevance 0.5 only
    # spans >= 3 are kept (plus the first position), whatever the budget.
    values = [1.0] * 4 + [6.0] * 4 + [4.0] * 4 + [1.0] * 8
    spans = sentences(20, 4)
    assert relevant_profile(values, spans, 0.5).keep(15) == [0, 4, 5, 6, 7, 8, 9, 10, 11]
    assert relevant_profile(values, spans, 0.8).keep(15) == [0, 4, 5, 6, 7]
    assert relevant_profile(values, spans, 0.5).keep(3) == [0, 4, 5]  # the cap still binds: a partial window
    assert relevant_profile(values, spans, None).keep(15) == relevant_profile(values, spans, 1.0).keep(15, relevant_only=False)
    assert len(relevant_profile(values, spans, None).keep(15)) == 15
    # excluded spans are never kept under relevance, even when they score best
    excluded = [False] * 4 + [True] * 4 + [False] * 12
    assert relevant_profile(values, spans, 0.5, excluded).keep(15) == [0, 8, 9, 10, 11]


def test_pooled_relevance_is_relative_to_the_best_span_of_any_sender():
    holder = relevant_profile([1.0] * 8 + [6.0] * 4 + [1.0] * 8, sentences(20, 4), 0.5)
    other = relevant_profile([1.2] * 20, sentences(20, 4), 0.5)
    counts = pooled_counts([holder, other], [10, 10])
    assert counts == [1 + 4, 1]  # the holder's evidence sentence; the other sender only its first position
    assert holder.keep(counts[0], relevant_only=False) == [0, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="share it"):
        pooled_counts([holder, relevant_profile([1.0] * 20, sentences(20, 4), 0.3)], [10, 10])


def test_relevance_is_checked():
    from rclc.policy import selector_option_problems

    with pytest.raises(ValueError, match="relevance"):
        relevant_profile([1.0] * 8, sentences(8, 4), 1.5).keep(4)
    assert selector_option_problems("cacheback", {"relevance": 0.4}) == []
    assert selector_option_problems("cacheback", {"relevance": 0}) == []  # 0: off, the whole budget
    for bad in (1.5, -0.1, True, "0.5"):
        assert selector_option_problems("cacheback", {"relevance": bad})[0][0] == "relevance"
    assert selector_option_problems("recent", {"relevance": 0.4})[0][0] == "relevance"
    assert selector_option_problems("chunkkv", {"exclude_by": "span"}) == []
    assert selector_option_problems("qsnap", {"exclude_by": "sentence"})[0][:2] == (
        "exclude_by", "exclude_by of selector 'qsnap' must be one of 'position', 'span', got 'sentence'")
    assert selector_option_problems("recent", {"exclude_by": "span"})[0][0] == "exclude_by"


def test_relevance_is_off_by_default():
    values = [1.0] * 4 + [6.0] * 4 + [4.0] * 4 + [1.0] * 8
    assert SpanOptions().relevance is None and SpanOptions().exclude_by == "position"
    assert relevant_profile(values, sentences(20, 4), None).keep(15) == keep_spans(
        torch.tensor(values), 15, sentences(20, 4))
