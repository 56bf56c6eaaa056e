"""The routing and review-loop examples on the embedded model (issue 13): the builder scripts in
examples/ run as a user runs them, the shipped topologies route and wait as documented, and
the waiting review loop answered later equals the run answered up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rclc_graph import plan_file, resume_run_sync, run_recorded_sync

from tests.helpers.reliability import assert_same_runs
from tests.paths import ROOT

pytestmark = pytest.mark.integration



def run_example(name: str, *arguments: str, cwd: Path) -> str:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), *arguments],
        capture_output=True, text=True, timeout=900, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout


def test_the_triage_example_routes_each_message_to_one_specialist(embedded, tmp_path):
    billing = run_example("triage", cwd=tmp_path)  # the example input: a double charge
    assert billing.startswith("finished") and "skipped technical: no inbound edge fired" in billing
    assert "\nbilling: " in billing
    technical = run_example("triage", "The app crashes every time I open the settings page.", cwd=tmp_path)
    assert "skipped billing: no inbound edge fired" in technical and "\ntechnical: " in technical


def test_the_review_loop_example_waits_for_approval_then_finishes(embedded, tmp_path):
    out = run_example("review_loop", "approved by Dana", cwd=tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith("waiting after ") and "final asks: Approve this announcement" in out
    assert "answering 'approved by Dana'" in out
    assert "finished; nodes run by the resume: []" in out
    assert any(line.startswith("final: ") for line in lines)
    assert "\n\napproved by Dana\nrecord: " in out  # the answer follows the editor's text in the output


def test_the_review_loop_answered_later_equals_answered_up_front(embedded, tmp_path):
    inputs = json.loads((ROOT / "examples" / "inputs" / "review_loop.json").read_text())
    topology = ROOT / "topologies" / "review_loop.yaml"
    upfront, _, upfront_dir = run_recorded_sync(plan_file(topology, inputs, answers={"final": "approved"}),
                                                tmp_path / "upfront")
    assert upfront.status == "finished", upfront.error
    waiting, record, run_dir = run_recorded_sync(plan_file(topology, inputs), tmp_path / "asked")
    assert waiting.status == "waiting" and record["waiting"][0]["node"] == "final"
    rounds = {name.split("@")[1] for name in record["nodes"] if "@" in name}
    assert rounds and all(name in record["skipped"] for r in range(len(rounds) + 1, 4)
                          for name in (f"writer@{r}", f"critic@{r}"))
    resumed, record, _ = resume_run_sync(run_dir, answers={"final": "approved"})
    assert resumed.status == "finished" and record["attempts"][-1]["ran"] == []
    assert resumed.outputs == upfront.outputs and resumed.outputs["final"].endswith("\n\napproved")
    assert_same_runs(upfront_dir, run_dir)
