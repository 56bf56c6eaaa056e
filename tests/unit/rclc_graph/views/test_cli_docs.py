"""docs/cli.md agrees with the program a new user runs (issue 16 item 18)."""

from __future__ import annotations

import json
import re

import typer

from rclc_graph import plan_file
from rclc_graph.views.cli import app
from tests.paths import ROOT

CLI_DOC = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


def _synopsis() -> str:
    """The first code block of docs/cli.md: the synopsis of every command."""
    match = re.search(r"```\n(rclc-graph .*?)```", CLI_DOC, re.S)
    assert match, "docs/cli.md lost its synopsis block"
    return match.group(1)


def _leaves(group, prefix: str = "") -> list[tuple[str, object]]:
    """(name, command) of every runnable command; typer vendors its own click, so groups are
    told by their `commands` mapping rather than by class."""
    found = []
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found += _leaves(command, f"{prefix}{name} ")
        else:
            found.append((f"{prefix}{name}", command))
    return found


# issue 16 item 18: docs/cli.md's synopsis omitted experiment, data and compare-runs
def test_the_synopsis_lists_every_command_and_option():
    synopsis = _synopsis()
    leaves = _leaves(typer.main.get_command(app))
    commands = [f"rclc-graph {name}" for name, _ in leaves]
    assert {"rclc-graph experiment", "rclc-graph data make", "rclc-graph compare-runs"} <= set(commands)
    for command in commands:
        assert re.search(rf"^{re.escape(command)}\b", synopsis, re.M), f"{command} is missing from the synopsis"
    assert re.search(r"^rclc-graph --version$", synopsis, re.M)
    # every long option of every command is named on that command's synopsis lines
    for name, command in leaves:
        block = re.search(rf"^rclc-graph {re.escape(name)}\b.*?(?=^rclc-graph |\Z)", synopsis, re.M | re.S).group(0)
        for parameter in command.params:
            long = [option for option in parameter.opts if option.startswith("--")]
            if parameter.param_type_name == "option" and long:
                assert any(option in block for option in long), f"{name}: {long[0]} is missing from the synopsis"


# issue 16 item 18: docs/cli.md's validate example showed a stale fingerprint
def test_the_validate_example_shows_the_current_fingerprint():
    match = re.search(r"^\$ rclc-graph validate (\S+) --input (\S+)\n.*?fingerprint ([0-9a-f]{12})$", CLI_DOC, re.M | re.S)
    assert match, "docs/cli.md lost its validate --input example"
    topology, inputs, shown = match.groups()
    plan = plan_file(ROOT / topology, json.loads((ROOT / inputs).read_text(encoding="utf-8")))
    assert plan.fingerprint()[:12] == shown
