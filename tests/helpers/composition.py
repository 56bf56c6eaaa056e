"""The composition examples (topologies/incident_brief.yaml, plan_and_execute.yaml) on a tiny
random model, for the crash and Ray tests: the shipped topology with its models swapped, and a
function node for plan_and_execute.

The shipped function (examples/task_lists.py) makes one step per line the planner wrote; a
tiny random model writes no lines to speak of, so these tests range over three steps made
from its text instead: always three copies to run, and each copy's item still depends on
what the planner wrote, so a resume that ran the planner again would be caught."""

from __future__ import annotations

from pathlib import Path

from rclc_graph import GraphSpec, load_graph
from tests.paths import ROOT


def three_steps(inputs: dict, senders: dict[str, str]) -> list[str]:
    """Three steps, each naming the planner's text (at most 24 characters of it)."""
    text = " ".join(senders.values()).strip()[:24] or "nothing"
    return [f"step {number} of {text!r}" for number in (1, 2, 3)]


def shipped_on_tiny(name: str, source: Path) -> GraphSpec:
    """The shipped topology `name` with every model (subgraphs' included) read from `source`,
    6 new tokens per agent, and the planner's list made by `three_steps`."""
    data = load_graph(ROOT / "topologies" / f"{name}.yaml").model_dump(mode="json")
    stack = [data]
    while stack:
        topology = stack.pop()
        for model in topology["models"]:
            model["source"] = str(source)
        for agent in topology["agents"]:
            agent["max_new_tokens"] = 6
        for node in topology["nodes"]:
            if node.get("call") == "task_lists:numbered_lines":
                node["call"] = "tests.helpers.composition:three_steps"
            if isinstance(node.get("graph"), dict):
                stack.append(node["graph"])
    return GraphSpec.model_validate(data)
