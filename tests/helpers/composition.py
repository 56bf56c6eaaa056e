"""A function node for the crash tests of topologies/plan_and_execute.yaml on a tiny random model.

The shipped function (examples/task_lists.py) makes one step per line the planner wrote; a
tiny random model writes no lines to speak of, so these tests range over three steps made
from its text instead: always three copies to run, and each copy's item still depends on
what the planner wrote, so a resume that ran the planner again would be caught."""

from __future__ import annotations


def three_steps(inputs: dict, senders: dict[str, str]) -> list[str]:
    """Three steps, each naming the planner's text (at most 24 characters of it)."""
    text = " ".join(senders.values()).strip()[:24] or "nothing"
    return [f"step {number} of {text!r}" for number in (1, 2, 3)]
