"""Accuracy intervals (Wilson), McNemar's exact paired test and the small summaries, against
closed forms and independent computations."""

from __future__ import annotations

import math
import statistics

import pytest

from rclc_graph.experiments import stats

Z95 = statistics.NormalDist().inv_cdf(0.975)


def _binomial_pmf(n: int, k: int, p: float) -> float:
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


# issue 16 item 20: the bootstrap collapsed to [0%, 0%] at 0/n; Wilson's interval does not
@pytest.mark.parametrize("n", [1, 5, 10, 40])
def test_wilson_at_zero_and_all_correct_does_not_collapse(n):
    zero = stats.wilson_interval(0, n)
    assert zero.low == 0.0 and zero.high == pytest.approx(Z95**2 / (n + Z95**2))  # closed form at 0/n
    assert zero.high > 0.05
    full = stats.wilson_interval(n, n)
    assert full.high == 1.0 and full.low == pytest.approx(n / (n + Z95**2))


# issue 16 item 20
@pytest.mark.parametrize(("successes", "n"), [(5, 10), (1, 12), (30, 40), (6, 20), (250, 400)])
def test_wilson_ends_solve_the_score_equation(successes, n):
    # The Wilson interval is the set of p with |p_hat - p| <= z * sqrt(p (1 - p) / n): both ends
    # satisfy it with equality, and the point estimate lies inside.
    interval = stats.wilson_interval(successes, n)
    p_hat = successes / n
    for end in interval.to_list():
        assert (p_hat - end) ** 2 == pytest.approx(Z95**2 * end * (1 - end) / n, rel=1e-9)
    assert interval.low < p_hat < interval.high


def test_wilson_reference_value_and_confidence():
    # 5/10 at 95%: [0.2366, 0.7634], the value statistics packages print (e.g. R's prop.test
    # without continuity correction)
    assert stats.wilson_interval(5, 10).to_list() == pytest.approx([0.236593, 0.763407], abs=1e-6)
    narrow, wide = stats.wilson_interval(7, 20, confidence=0.5), stats.wilson_interval(7, 20, confidence=0.99)
    assert wide.low < narrow.low < narrow.high < wide.high
    assert stats.wilson_interval(0, 0) is None and stats.accuracy_interval([]) is None
    assert stats.accuracy_interval([True, False, True, True]) == stats.wilson_interval(3, 4)


# issue 16 item 20: coverage near the nominal 95% at small n, where the bootstrap fell short
@pytest.mark.parametrize(("n", "p"), [(10, 0.5), (20, 0.1), (30, 0.8)])
def test_wilson_exact_coverage_at_small_n(n, p):
    coverage = 0.0
    for k in range(n + 1):
        interval = stats.wilson_interval(k, n)
        if interval.low <= p <= interval.high:
            coverage += _binomial_pmf(n, k, p)
    assert coverage > 0.9


@pytest.mark.parametrize(
    ("args", "message"),
    [((3, 2), "more than"), ((-1, 2), "successes"), ((1, 2.0), "n"), ((True, 2), "successes")],
)
def test_wilson_argument_errors(args, message):
    with pytest.raises(ValueError, match=message):
        stats.wilson_interval(*args)
    for confidence in (0, 1.0, 1.5, "0.9"):
        with pytest.raises(ValueError, match="confidence"):
            stats.wilson_interval(1, 2, confidence=confidence)


# issue 16 item 20: McNemar's exact test, by hand
@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 0, 1.0),  # no discordant pair: nothing tells the arms apart
        (0, 6, 2 / 64),  # 2 * P(X <= 0), X ~ Bin(6, 1/2)
        (1, 5, 2 * 7 / 64),  # 2 * (1 + 6) / 2^6
        (3, 3, 1.0),  # doubling a tail above 1/2 caps at 1
        (0, 1, 1.0),
        (2, 10, 2 * (1 + 12 + 66) / 4096),
    ],
)
def test_mcnemar_exact_known_values(b, c, p):
    assert stats.mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)
    assert stats.mcnemar_exact(c, b) == stats.mcnemar_exact(b, c)


def test_mcnemar_exact_at_large_n_matches_a_float_tail():
    b, c = 120, 180
    n = b + c
    tail = math.fsum(math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))
                     for k in range(b + 1))
    assert stats.mcnemar_exact(b, c) == pytest.approx(2 * tail, rel=1e-9)
    assert stats.mcnemar_exact(0, 1000) == 2.0**-999  # exact integers: tiny tails stay exact
    assert stats.mcnemar_exact(5000, 5000) == 1.0  # 2^10000 does not overflow either
    with pytest.raises(ValueError, match="only_first"):
        stats.mcnemar_exact(-1, 3)
    with pytest.raises(ValueError, match="only_second"):
        stats.mcnemar_exact(1, 2.5)


def test_paired_comparison_counts_every_cell():
    pairs = [(True, True)] * 4 + [(True, False)] * 6 + [(False, True)] * 1 + [(False, False)] * 3
    comparison = stats.paired_comparison("new", "seed", pairs)
    assert (comparison.both_correct, comparison.only_first, comparison.only_second, comparison.both_wrong) == (4, 6, 1, 3)
    assert comparison.cases == 14 and comparison.p_value == stats.mcnemar_exact(6, 1)
    saved = comparison.to_dict()
    assert saved["first"] == "new" and saved["second"] == "seed" and saved["test"] == "mcnemar_exact_two_sided"
    assert saved["p_value"] == pytest.approx(2 * 8 / 128)
    assert stats.paired_comparison("a", "b", []).p_value == 1.0


def test_accuracy_mean_median():
    assert stats.accuracy([True, False, True, True]) == 0.75
    assert stats.accuracy([]) is None
    assert stats.mean([1, None, 2, 6]) == 3.0
    assert stats.mean([None]) is None
    assert stats.median([3, None, 1, 2, 10]) == 2.5
    assert stats.median([]) is None


# issue 16 item 20: warm-up runs leave latency medians
def test_median_excluding_warmup():
    assert stats.median_excluding([(30.0, True), (1.0, False), (2.0, False), (3.0, False)]) == (2.0, 3, False)
    # every value flagged: they all count, and the result says so
    assert stats.median_excluding([(30.0, True)]) == (30.0, 1, True)
    assert stats.median_excluding([(None, False), (4.0, False)]) == (4.0, 1, False)
    assert stats.median_excluding([]) == (None, 0, False)
