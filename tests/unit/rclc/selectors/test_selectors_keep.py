"""The keep step as a pure function: worked example, tie-breaks and properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rclc.selectors import fixed_span_keep, fixed_spans, keep_spans
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._spans import pin_first, span_means


def worked_example_scores() -> torch.Tensor:
    scores = torch.zeros(40)
    scores[0] = 0.5
    scores[5] = 0.9
    scores[20:26] = 1.0
    scores[22] = 3.0
    scores[33:36] = 0.2
    return scores


def test_worked_example_budget_12():
    assert fixed_span_keep(worked_example_scores(), 12, 16, latent_steps=2) == [0, *range(18, 27), 38, 39]


def test_worked_example_budget_24():
    assert fixed_span_keep(worked_example_scores(), 24, 16, latent_steps=2) == [*range(0, 6), *range(16, 32), 38, 39]


def test_worked_example_span_means_use_the_pinned_scores():
    pinned = pin_first(worked_example_scores())
    means = span_means(pinned, fixed_spans(40, 16))
    expected = torch.tensor([3.9 / 16, 8.0 / 16, 0.6 / 8])
    torch.testing.assert_close(means, expected)


def test_pin_does_not_mutate_the_input():
    scores = worked_example_scores()
    before = scores.clone()
    fixed_span_keep(scores, 12, 16, latent_steps=2)
    assert torch.equal(scores, before)


def test_window_ties_break_to_the_earlier_start():
    # Span [8, 18) ranks first; its peak is the first maximum (11); room 2: windows (10, 11)
    # and (11, 12) are equally close to the peak and equally wide, so the earlier one wins.
    scores = torch.zeros(18)
    scores[11] = scores[12] = 1.0
    assert keep_spans(scores, 3, [(0, 8), (8, 18)]) == [0, 10, 11]


def test_partial_first_span_hugs_position_zero():
    # The pinned position 0 is the first maximum of span 0, hence the peak of its window.
    scores = torch.zeros(10)
    scores[6] = 5.0
    assert keep_spans(scores, 4, [(0, 10)]) == [0, 1, 2, 3]


def test_span_ranking_is_stable_for_ties():
    scores = torch.ones(32)  # every span mean equal (after pinning, span 0 still equal)
    assert fixed_span_keep(scores, 17, 8) == list(range(17))


def test_first_maximum_is_the_peak():
    scores = torch.zeros(16)
    scores[8] = scores[12] = 2.0
    scores[0] = 0.0
    # Span [8, 16) overshoots with room 2 (protected {0}); peak is the first maximum, 8.
    assert fixed_span_keep(scores, 3, 8) == [0, 8, 9]


def test_budget_covering_everything_returns_all_positions():
    assert fixed_span_keep(torch.rand(10), 10, 4) == list(range(10))
    assert fixed_span_keep(torch.rand(10), 50, 4, latent_steps=3) == list(range(10))


def test_protected_positions_above_budget_raise():
    with pytest.raises(ValueError, match="budget"):
        fixed_span_keep(torch.rand(10), 2, 4, latent_steps=2)


def test_bad_partitions_raise():
    with pytest.raises(ValueError, match="spans"):
        keep_spans(torch.rand(10), 3, [(0, 4), (5, 10)])
    with pytest.raises(ValueError, match="spans"):
        keep_spans(torch.rand(10), 3, [(0, 4), (4, 8)])
    with pytest.raises(ValueError, match="scores"):
        keep_spans(torch.rand(2, 5), 3, [(0, 5)])


def test_fixed_spans_grid():
    assert fixed_spans(40, 16) == [(0, 16), (16, 32), (32, 40)]
    assert fixed_spans(32, 16) == [(0, 16), (16, 32)]
    assert fixed_spans(3, 16) == [(0, 3)]


@st.composite
def keep_cases(draw):
    total = draw(st.integers(1, 120))
    span_size = draw(st.integers(1, 20))
    latent = draw(st.integers(0, total - 1))
    budget = draw(st.integers(latent + 1, total + 3))
    values = draw(
        st.lists(
            st.one_of(st.floats(0, 10, width=32), st.sampled_from([0.0, 1.0])), min_size=total, max_size=total
        )
    )
    return torch.tensor(values, dtype=torch.float32), budget, span_size, latent


@settings(max_examples=300, deadline=None)
@given(keep_cases())
def test_keep_step_properties(case):
    scores, budget, span_size, latent = case
    total = scores.shape[0]
    kept = fixed_span_keep(scores, budget, span_size, latent_steps=latent)
    assert kept == sorted(set(kept))
    assert all(0 <= position < total for position in kept)
    assert len(kept) == min(budget, total)
    protected = {0, *range(total - latent, total)}
    assert protected <= set(kept)
    # Every span is kept whole, not at all, or (at most one span) as one contiguous window
    # that may only step over protected positions.
    kept_set = set(kept)
    partial = 0
    for start, stop in fixed_spans(total, span_size):
        added = [p for p in range(start, stop) if p in kept_set and p not in protected]
        free = [p for p in range(start, stop) if p not in protected]
        if added and len(added) < len(free):
            partial += 1
            assert set(range(added[0], added[-1] + 1)) <= kept_set
    assert partial <= 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_uniform_span_means_match_per_span_means(total, span_size, seed):
    scores = torch.rand(total, generator=torch.Generator().manual_seed(seed)) * 100
    spans = fixed_spans(total, span_size)
    per_span = torch.stack([scores[start:stop].mean() for start, stop in spans])
    assert torch.equal(span_means(scores, spans), per_span)
