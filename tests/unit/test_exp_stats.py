"""Bootstrap intervals against closed forms, and the small summaries."""

from __future__ import annotations

import math

import pytest

from rclc_graph.experiments import stats


def _binomial_quantile(n: int, p: float, q: float) -> int:
    """Smallest k with P(Binomial(n, p) <= k) >= q."""
    total = 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if total >= q - 1e-12:
            return k
    return n


@pytest.mark.parametrize(("n", "successes"), [(20, 6), (40, 30), (50, 25), (12, 1)])
def test_bootstrap_interval_of_bernoulli_matches_the_binomial(n, successes):
    # Resampling n 0/1 outcomes with replacement draws Binomial(n, successes/n) successes, so
    # the percentile interval is the binomial's 2.5% and 97.5% quantiles over n (up to one
    # step of 1/n from sampling 10,000 resamples).
    values = [1] * successes + [0] * (n - successes)
    interval = stats.bootstrap_mean_interval(values, seed=1)
    p = successes / n
    low, high = _binomial_quantile(n, p, 0.025) / n, _binomial_quantile(n, p, 0.975) / n
    assert abs(interval.low - low) <= 1 / n + 1e-9
    assert abs(interval.high - high) <= 1 / n + 1e-9
    assert interval.low <= p <= interval.high


def test_bootstrap_width_matches_the_normal_approximation_for_large_n():
    n, p = 400, 0.7
    values = [1] * int(n * p) + [0] * int(n * (1 - p))
    interval = stats.bootstrap_mean_interval(values, seed=0)
    half = 1.959964 * math.sqrt(p * (1 - p) / n)
    assert interval.low == pytest.approx(p - half, abs=0.01)
    assert interval.high == pytest.approx(p + half, abs=0.01)


def test_bootstrap_known_cases_and_determinism():
    assert stats.bootstrap_mean_interval([1, 1, 1]).to_list() == [1.0, 1.0]
    assert stats.bootstrap_mean_interval([0.0] * 9).to_list() == [0.0, 0.0]
    assert stats.bootstrap_mean_interval([5.0]).to_list() == [5.0, 5.0]
    assert stats.bootstrap_mean_interval([]) is None
    values = [1, 0, 1, 1, 0, 1, 0, 1]
    assert stats.bootstrap_mean_interval(values, seed=3) == stats.bootstrap_mean_interval(values, seed=3)
    spread = [0.13, 2.9, 1.7, 0.41, 3.3, 0.05, 1.1, 2.2]
    assert stats.bootstrap_mean_interval(spread, seed=3, resamples=200) != stats.bootstrap_mean_interval(spread, seed=4, resamples=200)
    narrow = stats.bootstrap_mean_interval(values, confidence=0.5)
    wide = stats.bootstrap_mean_interval(values, confidence=0.99)
    assert wide.low <= narrow.low <= narrow.high <= wide.high
    # many resamples over many cases go through the chunked path and stay within [min, max]
    big = stats.bootstrap_mean_interval([i % 2 for i in range(5000)], resamples=2000)
    assert 0.47 < big.low < 0.5 < big.high < 0.53


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"resamples": 0}, "resamples"), ({"resamples": 1.5}, "resamples"), ({"confidence": 1.0}, "confidence"),
     ({"confidence": 0}, "confidence")],
)
def test_bootstrap_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        stats.bootstrap_mean_interval([1, 0], **kwargs)
    with pytest.raises(ValueError, match="finite"):
        stats.bootstrap_mean_interval([1.0, float("nan")])


def test_accuracy_mean_median():
    assert stats.accuracy([True, False, True, True]) == 0.75
    assert stats.accuracy([]) is None
    assert stats.mean([1, None, 2, 6]) == 3.0
    assert stats.mean([None]) is None
    assert stats.median([3, None, 1, 2, 10]) == 2.5
    assert stats.median([]) is None
