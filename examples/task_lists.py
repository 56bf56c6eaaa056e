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
    """The planner's text as a list of steps: one per non-empty line, numbering and bullets
    removed, at most MAX_STEPS. A text without line breaks is one step."""
    text = "\n".join(senders.values())
    steps = [_MARKER.sub("", line).strip() for line in text.splitlines()]
    return [step for step in steps if step][:MAX_STEPS]
