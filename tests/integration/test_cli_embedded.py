"""Every rclc-graph command on the embedded SmolLM2-135M, as a user runs them.

`run` goes through a subprocess (`python -m rclc_graph.views.cli`, the same code as the console
script) so stdout, exit codes and Ctrl-C behave as in a terminal session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc_graph import json_schema, load_graph
from rclc_graph.views.cli import app
from rclc_graph.run.record import finished_nodes, read_record
from tests.paths import ROOT

pytestmark = pytest.mark.integration

SHIPPED = ["chain_of_agents", "debate", "fanout_qa", "hierarchical", "triage", "review_loop"]
runner = CliRunner()


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "rclc_graph", *map(str, args)],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout,
    )


def only_run_dir(out: Path) -> Path:
    (run_dir,) = [path for path in out.iterdir() if path.is_dir()]
    return run_dir


def test_the_demo_command_runs_records_and_inspects(tmp_path):
    """What `make demo` runs (plus --out), then inspect, on the shipped chain of agents."""
    out = tmp_path / "runs"
    done = cli("run", "topologies/chain_of_agents.yaml", "--input", "examples/inputs/chain_of_agents.json",
               "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run_dir(out)
    text = done.stdout
    for expected in ("chain_of_agents: four readers in a chain, one answer", "loading model base (embedded)",
                     "✓ reader_1", "← kept", "Outputs", "final:", "reader_3 → reader_4", "Lineage of final",
                     f"{run_dir}/report.html", f"rclc-graph inspect {run_dir}"):
        assert expected in text, expected
    assert "Traceback" not in done.stderr

    record = read_record(run_dir)
    assert record["status"] == "finished" and record["outputs"]["final"]
    assert record["models"][0]["fingerprint"] and record["versions"]["torch"]
    assert [hop["kept_positions"] <= hop["budget"] for hop in record["hops"]] == [True] * 4
    on_disk = finished_nodes(run_dir)
    assert sorted(on_disk) == sorted(record["nodes"]) == sorted(["reader_1", "reader_2", "reader_3", "reader_4", "final"])
    for name, node in record["nodes"].items():
        assert node["snapshot"]["model_identity"] == record["models"][0]["fingerprint"]
        assert len(node["prompt_offsets"]) == node["positions"] - node["inherited_positions"] - node["generated_tokens"]
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "Kept spans" in page and "<svg" in page and "<script" not in page

    shown = runner.invoke(app, ["inspect", str(run_dir)])
    assert shown.exit_code == 0
    assert "Lineage per node" in shown.stdout and "reader_4" in shown.stdout and "final:" in shown.stdout
    assert json.loads(runner.invoke(app, ["inspect", str(run_dir), "--json"]).stdout) == record


def test_ctrl_c_cancels_the_run_and_keeps_what_finished(tmp_path):
    out = tmp_path / "runs"
    environment = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "rclc_graph", "run", "topologies/chain_of_agents.yaml", "--input",
         "examples/inputs/chain_of_agents.json", "--out", str(out)],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 600
        for line in process.stdout:
            lines.append(line)
            if "✓ reader_1" in line:
                process.send_signal(signal.SIGINT)
                break
            assert time.monotonic() < deadline
        rest, errors = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    text = "".join(lines) + rest
    assert process.returncode == 130, text + errors
    assert "interrupted: cancelling the run" in text and "interrupted; finished nodes: reader_1" in text
    assert "Traceback" not in errors
    record = read_record(only_run_dir(out))
    assert record["status"] == "cancelled"
    assert "reader_1" in record["nodes"] and "final" in record["unfinished"]
    assert set(finished_nodes(only_run_dir(out))) == set(record["nodes"])


def test_jsonl_runs_each_line_and_prints_json(tmp_path):
    topology = tmp_path / "echo.yaml"
    topology.write_text(
        "version: 1\nname: echo\ninputs: {text: str}\nmodels: [{name: base, source: embedded}]\n"
        "agents: [{name: a, model: base, max_new_tokens: 6}]\n"
        "nodes:\n  - {name: reader, agent: a, generate: false, prompt: '{text}'}\n"
        "  - {name: say, agent: a, output: true, prompt: 'Repeat the text.'}\n"
        "edges: [{source: reader, target: say, policy: {mode: full}}]\n"
    )
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"text": "The sky is green."}\n{"text": "Cats can fly."}\n')
    done = cli("run", topology, "--input", lines, "--out", tmp_path / "runs", "--json")
    assert done.returncode == 0, done.stderr
    summaries = [json.loads(line) for line in done.stdout.splitlines()]
    assert [summary["status"] for summary in summaries] == ["finished", "finished"]
    assert [read_record(summary["run_dir"])["inputs"]["text"] for summary in summaries] == [
        "The sky is green.", "Cats can fly."]
    for summary in summaries:
        (hop,) = summary["hops"]
        assert hop["policy"] == "full" and hop["kept_positions"] == hop["total_positions"]
        assert summary["lineage"]["say"]["by_node"]["reader"] == hop["total_positions"]


def test_the_docs_example_runs_and_matches_its_builder(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import incident_review
    finally:
        sys.path.remove(str(ROOT / "examples"))
    topology = ROOT / "examples" / "topologies" / "incident_review.yaml"
    assert incident_review.build().spec() == load_graph(topology)
    done = cli("run", topology, "--input", ROOT / "examples" / "inputs" / "incident_review.json",
               "--out", tmp_path / "runs")
    assert done.returncode == 0, done.stdout + done.stderr
    record = read_record(only_run_dir(tmp_path / "runs"))
    assert record["outputs"]["editor"] and [hop["policy"] for hop in record["hops"]] == ["b40"] * 3 + ["text"]
    # the fan-in pools its three b40 budgets (the graph's default): 120 positions over the readers
    by_node = record["lineage"]["drafter"]["by_node"]
    assert set(by_node) == {"reader[0]", "reader[1]", "reader[2]", "drafter"}
    assert sum(by_node[f"reader[{index}]"] for index in range(3)) == 120
    assert by_node["drafter"] == record["nodes"]["drafter"]["positions"] - 120
    assert [hop["fitted_budget"] for hop in record["hops"][:3]] == [40] * 3


@pytest.mark.parametrize("name", SHIPPED)
def test_validate_draw_and_schema_on_the_shipped_topologies(name, tmp_path):
    topology = ROOT / "topologies" / f"{name}.yaml"
    inputs = ROOT / "examples" / "inputs" / f"{name}.json"
    checked = runner.invoke(app, ["validate", str(topology), "--input", str(inputs)])
    assert checked.exit_code == 0 and "is valid" in checked.stdout
    mermaid = runner.invoke(app, ["draw", str(topology)])
    assert mermaid.exit_code == 0 and mermaid.stdout.startswith(f"%% {name}\nflowchart LR")
    image = tmp_path / f"{name}.png"
    assert runner.invoke(app, ["draw", str(topology), "--format", "png", "--out", str(image)]).exit_code == 0
    assert image.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(runner.invoke(app, ["schema"]).stdout) == json_schema("topology")
