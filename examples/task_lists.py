"""The function node of the plan_and_execute example: a planner's numbered lines as a JSON list.

Named in topologies/plan_and_execute.yaml as `task_lists:numbered_lines`, so this directory
must be importable (`PYTHONPATH=examples`) and the run needs `--trust-code`. The list it
returns is what the `worker` node ranges over at run time (`foreach: {node: steps}`): one
worker per line the planner wrote.
"""

from __future__ import annotations

import re

MAX_STEPS = 5  # the topology's max_items: a planner that writes more lines keeps its first five
_MARKER = re.compile(r"^\s*(?:(?:step\s*)?\d+\s*[.):-]|[-*•])\s*", re.IGNORECASE)


def numbered_lines(inputs: dict, senders: dict[str, str]) -> list[str]:
    """The planner's text as a list of steps: its numbered or bulleted lines without their
    markers (every non-empty line when none is marked; a text without line breaks is one
    step), at most MAX_STEPS."""
    lines = [line for line in "\n".join(senders.values()).splitlines() if line.strip()]
    marked = [line for line in lines if _MARKER.match(line)]
    steps = [_MARKER.sub("", line).strip() for line in (marked or lines)]
    return [step for step in steps if step][:MAX_STEPS]
