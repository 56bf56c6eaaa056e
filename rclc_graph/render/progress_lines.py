"""One line per finished step, with the time left, for output that is not a terminal.

A terminal gets rich's live bar. A log file or a pipe gets nothing from it until the end
(an experiment printed nothing to its log for 9 minutes), so the commands print a plain line
per step there instead:

    [12/40] c05 / r4: finished in 3.2 s; 41 s elapsed, about 1 min 54 s left

The estimate is the mean wall-clock time per step *computed* by this call (steps found done
on disk, e.g. a resumed experiment's rows, cost nothing and are not counted) times the steps
left; before the first computed step there is none. Pure: the caller passes the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from .units import format_duration, format_seconds


@dataclass
class StepEstimate:
    """The time left of `total` steps, from those computed so far (`started`: a monotonic clock)."""

    total: int
    started: float
    computed: int = 0

    def left(self, done: int, now: float) -> float | None:
        """Seconds left after `done` steps, or None before any step was computed."""
        if self.computed == 0:
            return None
        return (now - self.started) / self.computed * max(0, self.total - done)

    def line(self, done: int, label: str, outcome: str, *, computed: bool, seconds: float | None, now: float) -> str:
        """The progress line of the step that just ended (`computed` False: found done, not run)."""
        if computed:
            self.computed += 1
        head = f"[{done}/{self.total}] {label}: {outcome}"
        if seconds is not None and computed:
            head += f" in {format_seconds(seconds, decimals=1)}"
        elapsed = format_duration(now - self.started)
        left = self.left(done, now)
        if done >= self.total:
            return f"{head}; done in {elapsed}"
        if left is None:
            return f"{head}; {elapsed} elapsed"
        return f"{head}; {elapsed} elapsed, about {format_duration(left)} left"
