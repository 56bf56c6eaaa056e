"""Small statistics for experiment tables: accuracy with a bootstrap interval, medians, means.

Accuracy intervals are percentile bootstrap intervals: resample the per-case outcomes with
replacement `resamples` times (default 10,000), take each resample's mean, and report the
2.5th and 97.5th percentiles of those means. The generator is seeded, so a table is
reproducible to the last digit. With 0/1 outcomes the number of successes in a resample is
Binomial(n, accuracy), which gives the tests a closed form to check against.

The percentile bootstrap is honest about its limits: with few cases, or an accuracy of 0 or 1,
the interval collapses (every resample agrees), so tables also print the number of cases.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def bootstrap_mean_interval(
    values: Sequence[float] | Sequence[bool],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> Interval | None:
    """Percentile bootstrap interval of the mean of `values`; None for no values."""
    if type(resamples) is not int or resamples < 1:
        raise ValueError(f"resamples: expected a whole number >= 1, got {resamples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: expected a number between 0 and 1, got {confidence!r}")
    data = numpy.asarray(values, dtype=numpy.float64)
    if data.ndim != 1:
        raise ValueError("values: expected a flat sequence of numbers")
    if data.size == 0:
        return None
    if not numpy.all(numpy.isfinite(data)):
        raise ValueError("values: every value must be a finite number")
    generator = numpy.random.default_rng(seed)
    means = numpy.empty(resamples, dtype=numpy.float64)
    chunk = max(1, 4_000_000 // data.size)  # bound memory: at most ~32 MB of indices at once
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        picks = generator.integers(0, data.size, size=(stop - start, data.size))
        means[start:stop] = data[picks].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = numpy.quantile(means, [tail, 1 - tail])
    return Interval(float(low), float(high))


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
