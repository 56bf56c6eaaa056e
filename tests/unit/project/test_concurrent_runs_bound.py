"""benchmarks/concurrent_runs.py says how far scheduling alone could lift its ratio (issue 28):
the ratio at the concurrent phase's measured CPU seconds with every usable core busy."""

from __future__ import annotations

import pytest

from tests.helpers.benchmarks import load_benchmark


def _benchmark():
    return load_benchmark("concurrent_runs")


def test_bound_spreads_the_concurrent_cpu_over_every_core():
    bound = _benchmark().core_bound(73.39, 49.83, 2)
    assert bound == {"usable_cores": 2, "ratio_if_every_core_busy": pytest.approx(2.95, abs=0.005)}


def test_more_cores_raise_the_bound_and_no_cpu_gives_none():
    core_bound = _benchmark().core_bound
    assert core_bound(60.0, 30.0, 4)["ratio_if_every_core_busy"] == 8.0
    assert core_bound(60.0, 0.0, 2)["ratio_if_every_core_busy"] == 0.0
