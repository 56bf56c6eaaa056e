"""The composition examples on the embedded model (issue 27): topologies/incident_brief.yaml (a
subgraph as one node) and topologies/plan_and_execute.yaml (a foreach over a list written at run
time), run through the CLI as docs/graphs.md shows them.

What is checked is structure and lineage, which do not depend on what the 135M model happens
to write: which plan nodes ran, which handoffs each received (with the request each was
selected for), where every inherited position came from and across how many hops, the
record's subgraph instances and the report's nested sections. The only model text read is the
planner's, to check that the list the workers ranged over is the one its lines give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rclc_graph.run.record import read_record
from tests.paths import ROOT

pytestmark = pytest.mark.integration

sys.path.insert(0, str(ROOT / "examples"))

import task_lists  # noqa: E402  (examples/: the function node of plan_and_execute.yaml)


def run_cli(name: str, out: Path, *extra: str) -> dict:
    """`rclc-graph run topologies/NAME.yaml --input examples/inputs/NAME.json --json`, with the
    examples directory importable (as the topology's comment says); the record it wrote."""
    completed = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", f"topologies/{name}.yaml", "--input",
         f"examples/inputs/{name}.json", "--out", str(out), "--json", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'examples'}"), check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    summary = json.loads(completed.stdout)
    assert summary["status"] == "finished", summary
    return read_record(Path(summary["run_dir"]))


def hops_into(record: dict, target: str) -> list[dict]:
    return [hop for hop in record["hops"] if hop["target"] == target]


def test_incident_brief_runs_its_evidence_subgraph_as_one_node(embedded, tmp_path):
    record = run_cli("incident_brief", tmp_path)
    readers = [f"evidence/reader[{index}]" for index in range(3)]
    assert list(record["nodes"]) == ["framing", *readers, "evidence/notes", "brief"]
    assert set(record["outputs"]) == {"brief"} and record["outputs"]["brief"].strip()
    (instance,) = record["plan"]["subgraphs"]
    assert instance["name"] == "evidence" and instance["graph"] == "evidence" and instance["returns"] == "evidence/notes"
    assert instance["entries"] == readers and instance["inputs"]["reports"] == json.loads(
        (ROOT / "examples" / "inputs" / "incident_brief.json").read_text())["reports"]
    # the edge into the subgraph node reached every entry node, selected for that reader's own prompt
    for reader in readers:
        (hop,) = hops_into(record, reader)
        assert (hop["source"], hop["policy"], hop["kept_positions"]) == ("framing", "b16", 16)
        assert record["lineage"][reader]["by_node"]["framing"] == 16
    into_notes = hops_into(record, "evidence/notes")
    assert [hop["source"] for hop in into_notes] == readers  # one pooled b40 fan-in: 120 positions over three
    assert sum(hop["kept_positions"] for hop in into_notes) == 120 and all(hop["fitted_budget"] == 40 for hop in into_notes)
    # the edge out of it left from the returned node, with the state the note-taker held
    (out,) = hops_into(record, "brief")
    assert out["source"] == "evidence/notes" and out["policy"] == "r2"
    kept_from = out["kept_by_origin"]
    assert set(kept_from) <= {"framing", *readers, "evidence/notes"} and kept_from.get("evidence/notes", 0) > 0
    # nested lineage: in brief, the framing rows crossed three hops, the readers' two, the notes' one
    segments = record["nodes"]["brief"]["lineage"]["segments"]
    hops_of = {}
    for origin, _kind, hops, _start, _length in segments:
        hops_of.setdefault(origin, set()).add(hops)
    assert hops_of["brief"] == {0} and hops_of["evidence/notes"] == {1}
    assert all(hops_of[name] == {2} for name in readers if name in hops_of) and hops_of.get("framing", {3}) == {3}
    report = (tmp_path / record["run_id"] / "report.html").read_text()
    assert "<h2>Subgraphs</h2>" in report and "evidence/notes (returned)" in report
    assert 'data-scope="evidence"' in report


def test_plan_and_execute_runs_one_worker_per_listed_step(embedded, tmp_path):
    record = run_cli("plan_and_execute", tmp_path, "--trust-code")
    nodes = record["nodes"]
    steps = json.loads(nodes["steps"]["text"])
    assert steps == task_lists.numbered_lines({}, {"planner": nodes["planner"]["text"]}) and steps
    workers = [f"worker[{index}]" for index in range(len(steps))]
    assert [name for name in nodes if name.startswith("worker")] == workers
    assert sorted(record["skipped"]) == [f"worker[{index}]" for index in range(len(steps), 5)]
    assert all(reason == f"steps's list has {len(steps)} item{'s' if len(steps) > 1 else ''}"
               for reason in record["skipped"].values())
    for worker, step in zip(workers, steps, strict=True):
        assert f"Your step: {step}" in nodes[worker]["prompt_text"]
        (hop,) = hops_into(record, worker)  # the context, selected for this copy's own step
        assert hop["source"] == "context" and hop["kept_positions"] == 24 and hop["inherited_positions"] == 0
        assert record["lineage"][worker]["by_node"]["context"] == 24
    assert [hop["source"] for hop in hops_into(record, "report")] == workers
    assert all(hop["mode"] == "text" for hop in hops_into(record, "report")) and record["outputs"]["report"].strip()
    report = (tmp_path / record["run_id"] / "report.html").read_text()
    assert "<h2>Run-time foreach</h2>" in report
