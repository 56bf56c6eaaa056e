"""Command output that is not a terminal (a log, a pipe, CliRunner) is never hard-wrapped
(issue 24 item wrap): `compare-runs A A` printed "same\\ndirectory" once the temporary path was
long enough, so the test matching the message failed at some path lengths and not others."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc_graph.experiments import commands
from rclc_graph.views.cli import app

runner = CliRunner()


def _deep(base: Path, length: int) -> Path:
    directory = base / ("d" * length)
    directory.mkdir(parents=True)
    return directory


def _lines_with(output: str, *words: str) -> list[str]:
    return [line for line in output.splitlines() if all(word in line for word in words)]


# issue 24 item wrap
@pytest.mark.parametrize("length", [1, 37, 80, 150, 230])
def test_an_error_naming_a_long_path_stays_on_one_line(tmp_path, length):
    directory = _deep(tmp_path, length)
    (directory / "link").symlink_to(directory)
    result = runner.invoke(commands.app, ["compare-runs", str(directory), str(directory / "link")])
    assert result.exit_code == 2
    assert len(_lines_with(result.output, "error:", str(directory), "same directory")) == 1, result.output

    missing = directory / "missing.yaml"
    result = runner.invoke(app, ["validate", str(missing)])
    assert result.exit_code == 1  # validate found a problem: the file is missing
    assert len(_lines_with(result.output, "error:", str(missing))) == 1, result.output


# issue 24 item wrap: an explicit COLUMNS (pytest-xdist's workers get COLUMNS=80) must not
# hard-wrap messages off a terminal either
def test_columns_sets_table_width_but_never_wraps_messages_off_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    directory = _deep(tmp_path, 120)
    (directory / "link").symlink_to(directory)
    result = runner.invoke(commands.app, ["compare-runs", str(directory), str(directory / "link")])
    assert len(_lines_with(result.output, "error:", str(directory), "same directory")) == 1, result.output
