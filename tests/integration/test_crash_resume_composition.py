"""Crash and resume of the composition examples (issue 27): `rclc-graph run` of
topologies/incident_brief.yaml (a subgraph) and topologies/plan_and_execute.yaml (a foreach over
a list written at run time) in a subprocess, SIGKILLed before the subgraph starts, between its
nodes, between a snapshot and its node file and inside a generation step; and before the list
exists, between the copies that range over it, and inside their generation. Then resumed:
every output, hop, lineage and snapshot equals the uninterrupted run's, copies past the list's
end are skipped again, and finished nodes do no model work again.

The shipped files run with every model, the subgraph's too, swapped for a tiny random one saved
to a directory (as the other crash tests do); plan_and_execute's list comes from
tests/helpers/composition.py, which always makes three steps out of the tiny planner's text (the
shipped function makes one per line, and random weights write no lines)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rclc_graph import ModelPool, compile_plan, finished_nodes, load_graph, resume_run_sync, to_yaml
from rclc_graph.run.record import read_record
from rclc_graph.spec.models import GraphSpec

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

# incident_brief: framing, evidence/reader[0..2], evidence/notes, brief.
# plan_and_execute: context, planner, steps, worker[0..2] (worker[3], worker[4] skipped), report.
KILL_POINTS = {
    "incident_brief": ["start", "after:1", "after:3", "after:4", "torn:5", "forward:9"],
    "plan_and_execute": ["after:2", "after:3", "after:4", "after:5", "torn:6", "forward:12"],
}
TRUST = {"incident_brief": (), "plan_and_execute": ("--trust-code",)}


def _on_tiny(name: str, source: Path) -> GraphSpec:
    """The shipped topology with every model (subgraphs' included) read from `source`."""
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


def _environment() -> dict[str, str]:
    environment = cli_environment()
    environment["PYTHONPATH"] = str(ROOT)
    return environment


@pytest.fixture(scope="module", params=["incident_brief", "plan_and_execute"])
def example(request, tmp_path_factory):
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    source = save_tiny(directory / "tiny")
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text())
    spec = _on_tiny(name, source)
    topology = directory / f"{name}.yaml"
    topology.write_text(to_yaml(spec))  # the subgraph inline: the run needs no other file
    inputs_file = directory / "inputs.json"
    inputs_file.write_text(json.dumps(inputs))
    reference = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", str(topology), "--input", str(inputs_file),
         "--out", str(directory / "reference"), "--json", *TRUST[name]],
        cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    reference_dir = only_run_dir(directory / "reference")
    record = read_record(reference_dir)
    if name == "plan_and_execute":
        assert set(record["skipped"]) == {"worker[3]", "worker[4]"}, record["skipped"]
        assert [hop["source"] for hop in record["hops"] if hop["target"] == "report"] == [
            "worker[0]", "worker[1]", "worker[2]"]
    else:
        assert record["plan"]["subgraphs"][0]["returns"] == "evidence/notes" and not record["skipped"]
    return {"name": name, "topology": topology, "inputs": inputs_file, "reference": reference_dir,
            "plan": compile_plan(load_graph(topology), inputs, trust_code=bool(TRUST[name])), "record": record}


def test_sigkill_mid_subgraph_and_mid_foreach_then_resume_gives_the_uninterrupted_run(example, tmp_path):
    trusted = bool(TRUST[example["name"]])
    states = []  # what each kill left finished
    for number, point in enumerate(KILL_POINTS[example["name"]]):
        out, marker = tmp_path / f"runs{number}", tmp_path / f"paused{number}"
        process = run_until(example["topology"], example["inputs"], point, out, marker, extra=TRUST[example["name"]],
                            env=_environment())
        process.send_signal(signal.SIGKILL)
        communicate_or_kill(process, 60)
        assert process.returncode == -signal.SIGKILL, point
        run_dir = only_run_dir(out)
        assert read_record(run_dir)["status"] == "running", point
        finished = set(finished_nodes(run_dir))
        states.append(finished)
        pool = ModelPool()
        loaded = pool.get(example["plan"].models()[0], example["topology"].parent)
        with ForwardCounter(loaded.model) as counter:
            result, record, _ = resume_run_sync(run_dir, pool=pool, executor=CountingExecutor(pool), trust_code=trusted)
        assert result.status == "finished", (point, result.error)
        assert_same_runs(example["reference"], run_dir)
        assert record["skipped"] == example["record"]["skipped"], point
        assert record["outputs"] == example["record"]["outputs"], point
        assert record["plan"]["subgraphs"] == example["record"]["plan"]["subgraphs"], point
        counts = dict(counter.counts)
        assert all(counts.get(name, 0) == 0 for name in finished), (point, counts)  # no model work again
        ran = set(record["attempts"][-1]["ran"])
        assert ran == set(example["record"]["nodes"]) - finished, point
    # the kills landed where they were meant to: inside the subgraph, or among the copies
    inside = ({f"evidence/reader[{index}]" for index in range(3)} | {"evidence/notes"}
              if example["name"] == "incident_brief" else {"worker[0]", "worker[1]", "worker[2]"})
    assert any(0 < len(state & inside) < len(inside) for state in states), states
    assert any(not state & inside for state in states), states
    if example["name"] == "plan_and_execute":  # the list was written and no copy had run yet
        assert any("steps" in state and not state & inside for state in states), states
