"""Small statistics for experiment tables: accuracy intervals, the paired test, medians, means.

Accuracy intervals are Wilson score intervals. Unlike a percentile bootstrap, a Wilson
interval does not collapse at 0/n or n/n (0 of 10 correct gives [0%, 27.8%], not [0%, 0%]),
and its coverage stays close to the nominal 95% at the small n experiments often have.

Two arms run on the same cases are compared with McNemar's exact test: only the cases where
exactly one arm was right (the discordant pairs, b and c) carry evidence about which arm is
better, and under "no difference" each is equally likely to go either way, so min(b, c) is
Binomial(b + c, 1/2). The two-sided p-value is that tail doubled (capped at 1).

We compute the binomial tail with integer arithmetic rather than importing scipy: scipy is
not a dependency of the package, and the exact tail is a sum of binomial coefficients over a
power of two, which Python's integers and `Fraction` give exactly (no underflow at large n).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

from ..errors import UsageError

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def _check_confidence(confidence: float) -> None:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise UsageError(f"confidence: expected a number between 0 and 1, got {confidence!r}")


def wilson_interval(successes: int, n: int, *, confidence: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """Wilson score interval of a proportion `successes / n`; None when n is 0."""
    _check_confidence(confidence)
    for name, value in (("successes", successes), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{name}: expected a whole number >= 0, got {value!r}")
    if successes > n:
        raise UsageError(f"successes: {successes} is more than n = {n}")
    if n == 0:
        return None
    z = statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    # exact ends at 0/n and n/n (the formula gives them up to rounding)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def accuracy_interval(outcomes: Iterable[bool], *, confidence: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """Wilson interval of the share of true outcomes; None for no outcomes."""
    values = [bool(value) for value in outcomes]
    return wilson_interval(sum(values), len(values), confidence=confidence)


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts.

    `only_first`: cases the first arm got right and the second wrong; `only_second` the
    reverse. p = min(1, 2 * P(X <= min(b, c))) for X ~ Binomial(b + c, 1/2); 1.0 without
    discordant pairs (nothing tells the arms apart).
    """
    for name, value in (("only_first", only_first), ("only_second", only_second)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{name}: expected a whole number >= 0, got {value!r}")
    n = only_first + only_second
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_first, only_second) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


@dataclass(frozen=True)
class PairedComparison:
    """Two arms on the cases both ran: the 2x2 table of outcomes and McNemar's exact p."""

    first: str
    second: str
    both_correct: int
    only_first: int  # first right, second wrong
    only_second: int  # second right, first wrong
    both_wrong: int
    p_value: float

    @property
    def cases(self) -> int:
        return self.both_correct + self.only_first + self.only_second + self.both_wrong

    def to_dict(self) -> dict[str, object]:
        """The two arms, the case count, the 2x2 table, p and the test's name, as plain data."""
        table = {name: getattr(self, name) for name in ("both_correct", "only_first", "only_second", "both_wrong")}
        return {"first": self.first, "second": self.second, "cases": self.cases, **table, "p_value": self.p_value,
                "test": "mcnemar_exact_two_sided"}


def paired_comparison(first: str, second: str, pairs: Iterable[tuple[bool, bool]]) -> PairedComparison:
    """Count (first correct, second correct) pairs, one per shared case, and test them."""
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for a, b in pairs:
        counts[(bool(a), bool(b))] += 1
    only_first, only_second = counts[(True, False)], counts[(False, True)]
    return PairedComparison(
        first, second, counts[(True, True)], only_first, only_second, counts[(False, False)],
        mcnemar_exact(only_first, only_second),
    )


def accuracy(outcomes: Iterable[bool]) -> float | None:
    values = [bool(value) for value in outcomes]
    return sum(values) / len(values) if values else None


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the values that are not None; None when there are none."""
    present = [float(value) for value in values if value is not None]
    return math.fsum(present) / len(present) if present else None


def median(values: Iterable[float | None]) -> float | None:
    present = [float(value) for value in values if value is not None]
    return float(statistics.median(present)) if present else None


def median_excluding(values: Sequence[tuple[float | None, bool]]) -> tuple[float | None, int, bool]:
    """Median of the values whose flag is False (e.g. not a warm-up run).

    Returns (median, how many values it is over, whether flagged values had to be used):
    when every value is flagged, all of them count, so a one-case arm still shows a latency,
    and the third item says the figure includes a warm-up.
    """
    kept = [value for value, flagged in values if not flagged and value is not None]
    if kept:
        return median(kept), len(kept), False
    every = [value for value, _ in values if value is not None]
    return median(every), len(every), bool(every)
