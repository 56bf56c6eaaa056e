"""benchmarks/peak_rss.py, the peak RSS every benchmark reports (concurrent_runs.py,
scaling.py, reader_memory.py): the kernel's high-water mark, reset at the block's start, so
a peak inside the block counts even when freed before it ends, a peak from before the block
does not, and no sampling thread runs beside the work it measures."""

from __future__ import annotations

import sys
import threading

import pytest

from tests.helpers.benchmarks import load_benchmark
from tests.paths import ROOT

MIB = 1 << 20
BUFFER = 256 * MIB
SLACK = 64 * MIB  # what the interpreter (or a thread another test left) may move meanwhile

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def _memory():
    return load_benchmark("peak_rss")


def _touched(size: int) -> bytearray:
    """A buffer whose every page is resident (a fresh mmap'd bytearray is zero pages until written)."""
    buffer = bytearray(size)
    buffer[::4096] = b"\x01" * len(range(0, size, 4096))
    return buffer


def test_a_peak_freed_inside_the_phase_counts_and_nothing_samples_beside_it():
    memory = _memory()
    threads = set(threading.enumerate())
    with memory.PeakRss() as phase:
        start = memory.rss()
        assert not set(threading.enumerate()) - threads  # no sampling thread started
        buffer = _touched(BUFFER)
        del buffer
    assert phase.method == "kernel_high_water_mark"
    assert phase.peak >= start + BUFFER - SLACK


def test_a_peak_from_before_the_phase_does_not_count():
    PeakRss = _memory().PeakRss
    buffer = _touched(BUFFER)
    before = PeakRss.high_water_mark()
    del buffer
    with PeakRss() as phase:
        pass
    assert phase.peak <= before - BUFFER + SLACK


def test_where_the_mark_cannot_be_reset_a_thread_samples(monkeypatch):
    memory = _memory()
    monkeypatch.setattr(memory.PeakRss, "_reset_high_water_mark", staticmethod(lambda: False))
    with memory.PeakRss() as phase:
        start = memory.rss()
        buffer = _touched(BUFFER)  # held to the end: the last sample sees it, whatever the timing
    assert phase.method == "sampled_every_10_ms"
    assert phase.peak >= start + BUFFER - SLACK
    del buffer


def test_every_benchmark_that_reports_memory_measures_it_the_same_way():
    """One method behind every documented memory figure: the scripts take `PeakRss` from
    the shared module rather than keeping samplers of their own."""
    for name in ("concurrent_runs", "scaling"):
        assert load_benchmark(name).PeakRss.__module__ == "peak_rss"
    source = (ROOT / "benchmarks" / "reader_memory.py").read_text()
    assert "from peak_rss import PeakRss" in source and "class PeakRss" not in source
