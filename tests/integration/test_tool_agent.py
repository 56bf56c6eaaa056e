"""topologies/tool_agent.yaml on the embedded model: as shipped, with its tool loop scripted,
from the builder example, and killed with SIGKILL at points inside and between its nodes,
then resumed to the uninterrupted run's outputs.

Unscripted, the shipped topology answers its example input (constrained tool calls, issue 27).
The other runs script the support node (tests/helpers/scripted_tools.py), so that kill points and
resumes land on known turns: it is made to write a JSON call of lookup_order, and then an
answer; the tool really queries examples/shop.sqlite, its result is appended to the real
model's state, and the writer generates freely from what it was handed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rclc_graph import ModelPool, finished_nodes, plan_file, resume_run_sync, run_recorded_sync
from rclc_graph.run.record import read_record
from tests.helpers.reliability import assert_same_runs, communicate_or_kill
from tests.helpers.scripted_tools import ENV, TOOL_AGENT_REPLIES, install, uninstall
from tests.paths import HELPERS, ROOT

pytestmark = pytest.mark.integration

TOPOLOGY = ROOT / "topologies" / "tool_agent.yaml"
INPUTS = ROOT / "examples" / "inputs" / "tool_agent.json"
SCRIPTED_CLI = HELPERS / "scripted_cli.py"
# support finished; inside support's first turn
# (the call); inside its second turn (after the tool result was appended).
KILL_POINTS = ["after:1", "forward:5", "forward:40"]


def _environment(scripted: bool = True) -> dict[str, str]:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]),
                       PYTHONUNBUFFERED="1")
    if scripted:
        environment[ENV] = json.dumps(TOOL_AGENT_REPLIES)
    return environment


def _only_run_dir(out: Path) -> Path:
    (run_dir,) = [path for path in out.iterdir() if path.is_dir()]
    return run_dir


def _cli(*arguments: str, scripted: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPTED_CLI), "--", *arguments]
    return subprocess.run(command, cwd=ROOT, env=_environment(scripted), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The scripted tool_agent run through the CLI, uninterrupted."""
    out = tmp_path_factory.mktemp("reference")
    done = _cli("run", str(TOPOLOGY), "--input", str(INPUTS), "--trust-code", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    return _only_run_dir(out)


@pytest.fixture
def scripted_here(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    install(TOOL_AGENT_REPLIES)
    yield
    uninstall()


def test_the_tool_loop_runs_on_the_embedded_model(reference):
    record = read_record(reference)
    assert record["status"] == "finished"
    support = record["nodes"]["support"]
    [call] = support["tool_calls"]
    assert call["name"] == "lookup_order" and call["arguments"] == {"order_id": "A-1002"} and call["error"] is None
    assert json.loads(call["result"])["expected_delivery"] == "2026-11-21"  # read from examples/shop.sqlite
    assert support["text"] == TOOL_AGENT_REPLIES["support"][1]
    assert [segment[1] for segment in support["lineage"]["segments"]] == ["prompt", "token", "tool", "token"]
    assert "You can call these tools:" in support["prompt_text"]  # SmolLM2's template has no tool format
    reply = record["nodes"]["reply"]
    assert json.loads(reply["text"]) and reply["inherited_positions"] == 256  # a structured reply, the findings budget
    page = (reference / "report.html").read_text()
    assert "Tool calls" in page and "lookup_order" in page


def test_the_shipped_topology_answers_its_example_unscripted_through_the_cli(tmp_path):
    """Constrained tool calls (issue 27): unscripted, greedy, the 135M model's calls parse and fit
    their tools; it first picks the wrong tool (orders_of_customer with the order number: the
    tool choice is the model's), gets an error result, and under tool_choice: required calls
    again, now lookup_order("A-1002"); the writer, handed 256 of the support's positions, fills
    its structured reply with the order's status and expected delivery."""
    done = _cli("run", str(TOPOLOGY), "--input", str(INPUTS), "--trust-code", "--out", str(tmp_path), "--json",
                scripted=False)
    assert done.returncode == 0, done.stderr
    record = read_record(_only_run_dir(tmp_path))
    assert record["status"] == "finished"
    calls = record["nodes"]["support"]["tool_calls"]
    assert 1 <= len(calls) <= 2 and all(not (call["error"] or "").startswith(("bad arguments", "unknown tool"))
                                        for call in calls)
    assert calls[-1]["name"] == "lookup_order" and calls[-1]["arguments"] == {"order_id": "A-1002"}
    assert calls[-1]["error"] is None and "2026-11-21" in calls[-1]["result"]
    # the writer's reply is structured (output_schema), its fields from the database's row
    reply = json.loads(record["outputs"]["reply"])
    assert {key: reply[key] for key in ("order_id", "status", "expected_delivery")} == {
        "order_id": "A-1002", "status": "shipped", "expected_delivery": "2026-11-21"}


def test_the_builder_example_runs_and_equals_the_yaml(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "tool_agent.py")], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("finished in ") and "reply: " in done.stdout


def _run_until(point: str, out: Path, marker: Path) -> subprocess.Popen:
    command = [sys.executable, str(SCRIPTED_CLI), point, str(marker), "--", "run", str(TOPOLOGY), "--input",
               str(INPUTS), "--trust-code", "--out", str(out), "--json"]
    process = subprocess.Popen(command, cwd=ROOT, env=_environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before reaching {point}: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            process.communicate()
            raise AssertionError(f"the run never reached {point}")
        time.sleep(0.02)
    return process


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_anywhere_then_resume_gives_the_uninterrupted_outputs(reference, scripted_here, tmp_path, point):
    process = _run_until(point, tmp_path / "runs", tmp_path / "paused")
    process.send_signal(signal.SIGKILL)
    communicate_or_kill(process, 60)
    assert process.returncode == -signal.SIGKILL
    run_dir = _only_run_dir(tmp_path / "runs")
    assert read_record(run_dir)["status"] == "running"
    before = set(finished_nodes(run_dir))
    result, record, _ = resume_run_sync(run_dir, pool=ModelPool(), trust_code=True)
    assert result.status == "finished", result.error
    assert_same_runs(reference, run_dir)
    assert sorted(record["attempts"][-1]["ran"]) == sorted({"support", "reply"} - before)
    calls = [{**call, "seconds": 0} for call in record["nodes"]["support"]["tool_calls"]]
    assert calls == [{**call, "seconds": 0} for call in read_record(reference)["nodes"]["support"]["tool_calls"]]
    assert len(calls) == 1


def test_a_run_resumed_in_process_without_trust_code_is_refused(reference, tmp_path, monkeypatch):
    """A run whose trust seal does not verify here (another user's key, as for a run directory
    copied from elsewhere) needs trust_code again: its record alone cannot grant it. (The same
    user's sealed run resumes without it: test_graph_trust.py.)"""
    from rclc_graph import ResumeError

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another-user"))
    with pytest.raises(ResumeError, match="--trust-code"):
        resume_run_sync(reference, pool=ModelPool())


def test_the_tool_agent_plan_equals_across_runs_in_process(scripted_here, tmp_path, reference):
    plan = plan_file(TOPOLOGY, json.loads(INPUTS.read_text()), trust_code=True)
    result, record, run_dir = run_recorded_sync(plan, tmp_path, pool=ModelPool())
    assert result.outputs == read_record(reference)["outputs"]
    assert_same_runs(reference, run_dir)
