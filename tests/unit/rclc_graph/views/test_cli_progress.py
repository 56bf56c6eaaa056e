"""Slow steps are not silent in logs (issue 27): `run` and `resume` say when models load and
how long it took when the output is not a terminal, and print nothing of it with --json."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rclc_graph import ModelPool
from rclc_graph.spec.models import ModelSpec
from rclc_graph.views.cli import app

from tests.helpers.graph_runs import CHAIN_INPUTS, CHAIN_YAML

runner = CliRunner()


@pytest.fixture
def files(tmp_path, tiny_qwen3, monkeypatch):
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny_qwen3)
    monkeypatch.setattr("rclc_graph.views.cli.default_pool", lambda: pool)
    topology = tmp_path / "chain.yaml"
    topology.write_text(CHAIN_YAML)
    inputs = tmp_path / "in.json"
    inputs.write_text(json.dumps(CHAIN_INPUTS))
    return topology, inputs, tmp_path / "runs"


def test_model_loading_says_before_and_after_in_a_log(files):
    topology, inputs, out = files
    result = runner.invoke(app, ["run", str(topology), "--input", str(inputs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    loading = next(index for index, line in enumerate(lines) if line.startswith("loading model base (embedded) …"))
    assert lines[loading + 1].startswith("  ready in ")
    (run_dir,) = list(out.iterdir())
    resumed = runner.invoke(app, ["resume", str(run_dir)])
    assert resumed.exit_code == 0, resumed.output
    assert "loading model base (embedded) …" in resumed.stdout and "  ready in " in resumed.stdout


def test_json_output_has_no_progress_lines(files):
    topology, inputs, out = files
    result = runner.invoke(app, ["run", str(topology), "--input", str(inputs), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "finished"  # stdout is the JSON line alone
    assert "loading model" not in result.output and "ready in" not in result.output
