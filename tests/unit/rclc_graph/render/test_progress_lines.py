"""Progress lines for logs and pipes (render/progress_lines.py, issue 27): one line per step,
the time left estimated from the steps this call computed (resumed ones cost nothing)."""

from __future__ import annotations

from rclc_graph.render import StepEstimate, format_duration


def test_the_estimate_counts_only_computed_steps_and_says_done_at_the_end():
    estimate = StepEstimate(total=4, started=100.0)
    assert estimate.line(1, "c1 / r4", "resumed", computed=False, seconds=None, now=100.5) == (
        "[1/4] c1 / r4: resumed; 0 s elapsed")  # no estimate before a computed step
    assert estimate.line(2, "c2 / r4", "finished", computed=True, seconds=30.0, now=130.0) == (
        "[2/4] c2 / r4: finished in 30.0 s; 30 s elapsed, about 1 min 00 s left")
    assert estimate.line(3, "c3 / r4", "failed", computed=True, seconds=60.0, now=190.0) == (
        "[3/4] c3 / r4: failed in 60.0 s; 1 min 30 s elapsed, about 45 s left")
    assert estimate.line(4, "c4 / r4", "finished", computed=True, seconds=10.0, now=200.0) == (
        "[4/4] c4 / r4: finished in 10.0 s; done in 1 min 40 s")


def test_durations_read_at_every_scale():
    assert [format_duration(value) for value in (0.4, 59.6, 65, 3600 + 125)] == ["0 s", "1 min 00 s", "1 min 05 s",
                                                                                 "1 h 02 min"]
