"""`rclc-graph data make` + `rclc-graph experiment` end to end on the embedded model, as a
user runs them: real scheduler runs, a summary whose figures follow from the rows, a
resume that computes nothing, and a greedy rerun that reproduces every answer.

The unit tier covers the maths with a simulated run; this is the one place the measured
pipeline (plans per arm, lineage, evidence survival, payload bytes) meets real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc_graph.views.cli import app
from rclc_graph.experiments.reproduce import compare_runs
from tests.paths import ROOT

pytestmark = pytest.mark.integration

FANOUT = ROOT / "topologies" / "fanout_qa.yaml"
# r4: CacheBack as the seed defines it; r4s: the graph defaults (sentence spans, exclusion)
ARMS = ["floor=question_only", "full=full", "r4=state:ratio=4,span=fixed,exclude=none", "r4s=state:ratio=4"]


def _experiment(data: Path, out: Path):
    arguments = ["experiment", "--topology", str(FANOUT), "--data", str(data), "--out", str(out), "--json"]
    for arm in ARMS:
        arguments += ["--arm", arm]
    return CliRunner().invoke(app, arguments)


def test_data_make_then_experiment_resume_and_rerun(tmp_path, embedded):
    data = tmp_path / "cases.jsonl"
    made = CliRunner().invoke(app, ["data", "make", "--size", "2", "--seed", "3", "--documents", "3", "--out", str(data)])
    assert made.exit_code == 0, made.output

    first = _experiment(data, tmp_path / "first")
    assert first.exit_code == 0, first.output
    summary = json.loads(first.output)
    assert summary["rows"]["computed"] == 2 * len(ARMS) and summary["cases"] == 2
    arms = summary["arms"]
    assert list(arms) == [arm.split("=")[0] for arm in ARMS]

    rows = [json.loads(line) for line in (tmp_path / "first" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * len(ARMS) and all(row.get("error") is None for row in rows)
    # issue 16 item 20: only the run that loaded the model is the warm-up, and the medians leave it out
    assert [row["warmup"] for row in rows] == [True] + [False] * (len(rows) - 1)
    assert arms[ARMS[0].split("=")[0]]["latency_runs"] == 1 and arms["full"]["latency_runs"] == 2
    assert len(summary["paired"]["pairs"]) == len(ARMS) * (len(ARMS) - 1) // 2
    for name, measures in arms.items():
        mine = [row for row in rows if row["arm"] == name]
        assert measures["failed"] == 0 and measures["finished"] == 2
        assert measures["accuracy"] == sum(row["correct"] for row in mine) / 2
        assert measures["payload_bytes"] == pytest.approx(sum(row["payload_bytes"] for row in mine) / 2)

    # budgets on real senders: three readers, I + ceil((T - I) / 4) of T positions each, pooled
    # over the fan-in (the graph's default), so the readers keep that sum between them
    full, r4 = arms["full"], arms["r4"]
    assert full["compression"] == 1.0 and full["evidence_survival"] == 1.0
    for row in (row for row in rows if row["arm"] == "r4"):
        assert sum(hop["kept_positions"] for hop in row["hops"]) == sum(
            -(-hop["sent_positions"] // 4) for hop in row["hops"])
    assert r4["positions"] < full["positions"] and 3.5 < r4["compression"] <= 4.0
    assert r4["payload_bytes"] < full["payload_bytes"]
    assert arms["r4s"]["positions"] == r4["positions"]  # span modes change what is kept, not how much
    for name in ("r4", "r4s"):
        assert 0.0 <= arms[name]["evidence_survival"] <= 1.0
    assert arms["floor"]["positions"] == 0 and arms["floor"]["evidence_survival"] is None
    assert summary["greedy"] is True and summary["model_fingerprints"]["base"]

    again = _experiment(data, tmp_path / "first")  # resume: every row is already there
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["rows"] == {"computed": 0, "resumed": 2 * len(ARMS), "recovered_bytes": 0}

    rerun = _experiment(data, tmp_path / "second")
    assert rerun.exit_code == 0, rerun.output
    reproduction = compare_runs(tmp_path / "first", tmp_path / "second")
    assert reproduction.reproduced and reproduction.identical == 2 * len(ARMS), reproduction.to_dict()
