"""Crash and resume of the routing and review-loop examples (issue 13): `rclc-graph run` of
topologies/triage.yaml and topologies/review_loop.yaml in a subprocess, SIGKILLed at every node
boundary, between a snapshot and its node file, and inside a generation step, then resumed;
every output, hop, lineage and snapshot equals the uninterrupted run's, skipped nodes are
skipped again, and finished nodes do no model work again. The waiting review loop, answered
through the CLI, equals the run given its answer up front.

The shipped files run with their model swapped for a tiny random one saved to a directory
(as the other crash tests do). Random weights never write APPROVED, so the review loop's
`until` is set, from a probe run, to the critic's exact round-2 reply: the loop stops after
round 2 and round 3 is skipped, as it would be for a critic that approves there."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rclc_graph import ModelPool, compile_plan, finished_nodes, load_graph, resume_run_sync, run_plan_sync, to_yaml
from rclc_graph.run.record import read_record

from tests.helpers.reliability import (
    ROOT,
    CountingExecutor,
    ForwardCounter,
    assert_same_runs,
    cli_environment,
    communicate_or_kill,
    only_run_dir,
    run_until,
    save_tiny,
)

pytestmark = pytest.mark.integration

ANSWERS = {"review_loop": {"final": "approved by Dana"}, "triage": {}}
KILL_POINTS = {
    "triage": ["start", "after:1", "after:2", "torn:2", "forward:3"],
    "review_loop": ["start", "after:1", "after:2", "after:3", "after:4", "after:5", "torn:4", "forward:6"],
}


def _on_tiny(name: str, source: Path, **updates):
    spec = load_graph(ROOT / "topologies" / f"{name}.yaml")
    models = [model.model_copy(update={"source": str(source)}) for model in spec.models]
    agents = [agent.model_copy(update={"max_new_tokens": 6}) for agent in spec.agents]
    return spec.model_copy(update={"models": models, "agents": agents, **updates})


def _stop_at_round_two(spec, inputs: dict) -> object:
    """The review loop with `until` holding exactly on the critic's round-2 reply."""
    data = spec.model_dump(mode="json")

    def with_until(until: dict) -> object:  # validated again, so `until` becomes a condition model
        edges = [{**edge, "until": until} if edge.get("until") else edge for edge in data["edges"]]
        return type(spec).model_validate({**data, "edges": edges})

    probe = run_plan_sync(compile_plan(with_until({"equals": "\u0000never"}), inputs, answers={"final": "x"}),
                          pool=ModelPool())
    first, second = probe.nodes["critic@1"].text.strip(), probe.nodes["critic@2"].text.strip()
    assert second and second != first, "the tiny critic wrote the same reply twice; pick another seed of inputs"
    return with_until({"equals": second})


@pytest.fixture(scope="module", params=["triage", "review_loop"])
def example(request, tmp_path_factory):
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    source = save_tiny(directory / "tiny")
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text())
    spec = _on_tiny(name, source)
    if name == "review_loop":
        spec = _stop_at_round_two(spec, inputs)
    topology = directory / f"{name}.yaml"
    topology.write_text(to_yaml(spec))
    inputs_file = directory / "inputs.json"
    inputs_file.write_text(json.dumps(inputs))
    answers = [f"--answer={node}={text}" for node, text in ANSWERS[name].items()]
    reference = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", str(topology), "--input", str(inputs_file),
         "--out", str(directory / "reference"), "--json", *answers],
        cwd=ROOT, env=cli_environment(), capture_output=True, text=True, timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    reference_dir = only_run_dir(directory / "reference")
    record = read_record(reference_dir)
    if name == "review_loop":
        assert set(record["skipped"]) == {"writer@3", "critic@3"}, record["skipped"]
        assert {hop["source"] for hop in record["hops"] if hop["target"] == "final"} == {"writer@2", "critic@2"}
    else:
        assert len(record["skipped"]) == 1
    return {"name": name, "topology": topology, "inputs": inputs_file, "reference": reference_dir,
            "plan": compile_plan(load_graph(topology), inputs), "record": record}


def test_sigkill_at_every_point_then_resume_gives_the_uninterrupted_run(example, tmp_path):
    for number, point in enumerate(KILL_POINTS[example["name"]]):
        out, marker = tmp_path / f"runs{number}", tmp_path / f"paused{number}"
        process = run_until(example["topology"], example["inputs"], point, out, marker)
        process.send_signal(signal.SIGKILL)
        communicate_or_kill(process, 60)
        assert process.returncode == -signal.SIGKILL, point
        run_dir = only_run_dir(out)
        assert read_record(run_dir)["status"] == "running", point
        finished = set(finished_nodes(run_dir))
        pool = ModelPool()
        loaded = pool.get(example["plan"].models()[0], example["topology"].parent)
        with ForwardCounter(loaded.model) as counter:
            result, record, _ = resume_run_sync(run_dir, pool=pool, executor=CountingExecutor(pool),
                                                answers=ANSWERS[example["name"]])
        assert result.status == "finished", (point, result.error)
        assert_same_runs(example["reference"], run_dir)
        assert record["skipped"] == example["record"]["skipped"], point
        assert record["outputs"] == example["record"]["outputs"], point
        counts = dict(counter.counts)
        assert all(counts.get(name, 0) == 0 for name in finished), (point, counts)  # no model work again
        ran = set(record["attempts"][-1]["ran"])
        assert ran == set(example["record"]["nodes"]) - finished, point


def test_a_waiting_run_answered_through_the_cli_equals_the_run_answered_up_front(example, tmp_path):
    if not ANSWERS[example["name"]]:
        pytest.skip("triage asks no one")
    first = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", str(example["topology"]), "--input", str(example["inputs"]),
         "--out", str(tmp_path), "--json"],
        cwd=ROOT, env=cli_environment(), capture_output=True, text=True, timeout=300,
    )
    assert first.returncode == 3, first.stderr
    summary = json.loads(first.stdout)
    assert summary["status"] == "waiting" and summary["waiting"][0]["node"] == "final"
    run_dir = Path(summary["run_dir"])
    answers = [f"--answer={node}={text}" for node, text in ANSWERS[example["name"]].items()]
    resumed = subprocess.run([sys.executable, "-m", "rclc_graph", "resume", str(run_dir), "--json", *answers],
                             cwd=ROOT, env=cli_environment(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["outputs"] == example["record"]["outputs"]
    assert_same_runs(example["reference"], run_dir)
    record = read_record(run_dir)
    assert [attempt["status"] for attempt in record["attempts"]] == ["waiting", "finished"]
    assert record["attempts"][-1]["ran"] == []  # the answer needed no model work
