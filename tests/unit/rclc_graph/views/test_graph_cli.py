"""The rclc-graph CLI without the embedded model: exit codes, messages, JSON output, and runs
on a tiny random model registered in a private pool."""

from __future__ import annotations

import json

import anyio
import pytest
from typer.testing import CliRunner

from rclc_graph import ModelPool, ModelSpec, compile_plan, json_schema, load_graph_text
from rclc_graph.views.cli import app, execute, main
from rclc_graph.views.run_inputs import read_inputs
from rclc_graph.run import RunSettings
from rclc_graph.run.record import read_record

from tests.helpers.graph_runs import CHAIN_INPUTS, CHAIN_YAML, FakeExecutor
from tests.paths import ROOT

runner = CliRunner()
CHAIN = ROOT / "topologies" / "chain_of_agents.yaml"
CHAIN_INPUT = ROOT / "examples" / "inputs" / "chain_of_agents.json"


def invoke(*args: str):
    return runner.invoke(app, [str(arg) for arg in args])


@pytest.fixture
def small(tmp_path):
    """A small chain topology and its inputs as files."""
    topology = tmp_path / "small.yaml"
    topology.write_text(CHAIN_YAML)
    inputs = tmp_path / "in.json"
    inputs.write_text(json.dumps(CHAIN_INPUTS))
    return topology, inputs


@pytest.fixture
def tiny_pool(monkeypatch, tiny_llama):
    """The CLI's default pool, replaced by one that serves the tiny model as `embedded`."""
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), *tiny_llama)
    monkeypatch.setattr("rclc_graph.executors.pool.default_pool", lambda: pool)
    return pool


# -- schema, validate, draw --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["topology", "agent", "model"])
def test_schema_prints_the_json_schema(kind):
    result = invoke("schema", "--kind", kind)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == json_schema(kind)


def test_schema_refuses_an_unknown_kind():
    result = invoke("schema", "--kind", "graph")
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_validate_accepts_the_shipped_chain_and_plans_its_inputs():
    result = invoke("validate", CHAIN, "--input", CHAIN_INPUT)
    assert result.exit_code == 0, result.output
    assert "is valid" in result.stdout and "plan of 5 nodes" in result.stdout
    result = invoke("validate", CHAIN, "--input", CHAIN_INPUT, "--json")
    data = json.loads(result.stdout)
    assert data["valid"] and data["plans"][0]["outputs"] == ["final"]


def test_validate_reports_file_line_field_code_and_fix(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(CHAIN_YAML.replace("handoff: {mode: state, ratio: 2}", "handoff: {mode: state, ratoi: 2}"))
    result = invoke("validate", broken)
    assert result.exit_code == 1
    assert f"{broken}:13:26:" in result.stderr
    assert "policies.handoff.ratoi" in result.stderr and "[E_FIELD]" in result.stderr
    assert "fix:" in result.stderr and "ratio" in result.stderr
    assert "Traceback" not in result.output
    data = json.loads(invoke("validate", broken, "--json").stdout)
    assert data["valid"] is False and data["problems"][0]["code"] == "E_FIELD"
    assert data["problems"][0]["location"]["line"] == 13


def test_validate_names_the_bad_line_of_a_jsonl_input(small, tmp_path):
    topology, _ = small
    lines = tmp_path / "runs.jsonl"
    lines.write_text(json.dumps(CHAIN_INPUTS) + "\n\n" + json.dumps({"question": "q"}) + "\n")
    result = invoke("validate", topology, "--input", lines)
    assert result.exit_code == 1
    assert f"{lines}:3" in result.stderr and "E_INPUT" in result.stderr and "chunks" in result.stderr


def test_draw_mermaid_to_stdout_and_file(small, tmp_path):
    topology, inputs = small
    result = invoke("draw", topology)
    assert result.exit_code == 0
    assert result.stdout.startswith("%% small_chain\nflowchart LR\n") and '==>|"r2"|' in result.stdout
    out = tmp_path / "g.mmd"
    assert invoke("draw", topology, "--out", out).exit_code == 0
    assert out.read_text() == result.stdout
    planned = invoke("draw", topology, "--input", inputs)
    assert planned.exit_code == 0 and "reader_2" in planned.stdout


def test_draw_png(small, tmp_path):
    topology, _ = small
    out = tmp_path / "g.png"
    result = invoke("draw", topology, "--format", "png", "--out", out)
    assert result.exit_code == 0 and out.read_bytes()[:4] == b"\x89PNG"


def test_draw_of_an_invalid_topology_is_a_usage_error(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nnodes: [\n")
    result = invoke("draw", broken)
    assert result.exit_code == 2 and "E_YAML_SYNTAX" in result.stderr and "Traceback" not in result.output


# -- run: usage errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("in.txt", "{}", "must end in .json"),
        ("in.json", "[1, 2]", "one JSON object"),
        ("in.json", "{bad", "in.json:1:2: not valid JSON"),
        ("in.jsonl", '{"question": "q"}\n[]\n', "in.jsonl:2 is not a JSON object"),
        ("in.jsonl", "\n\n", "holds no runs"),
    ],
)
def test_run_refuses_bad_input_files(small, tmp_path, name, content, message):
    topology, _ = small
    path = tmp_path / name
    path.write_text(content)
    result = invoke("run", topology, "--input", path, "--out", tmp_path / "runs")
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_run_with_missing_files_or_inputs_is_a_usage_error(small, tmp_path):
    topology, inputs = small
    missing = invoke("run", topology, "--input", tmp_path / "nope.json")
    assert missing.exit_code == 2 and "is not a file" in missing.stderr
    no_topology = invoke("run", tmp_path / "nope.yaml", "--input", inputs)
    assert no_topology.exit_code == 2 and "nope.yaml:1:1: file not found" in no_topology.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"question": "q", "chunk": ["a"]}))
    result = invoke("run", topology, "--input", wrong)
    assert result.exit_code == 2
    assert "unknown input 'chunk'" in result.stderr and "fix: declared inputs: question, chunks" in result.stderr
    assert invoke("run", topology).exit_code == 2  # --input is required
    for outcome in (missing, no_topology, result):
        assert "Traceback" not in outcome.output


# -- run on a tiny model -----------------------------------------------------------------------


def test_run_records_and_prints_a_readable_result(small, tmp_path, tiny_pool):
    topology, inputs = small
    out = tmp_path / "runs"
    result = invoke("run", topology, "--input", inputs, "--out", out, "--seed", "3")
    assert result.exit_code == 0, result.output
    (run_dir,) = list(out.iterdir())
    record = read_record(run_dir)
    assert record["status"] == "finished" and record["seeds"]["run"] == 3
    text = result.stdout
    assert "small_chain: two readers and an answer" in text
    assert "✓ reader_1" in text and "kept" in text
    assert "Outputs" in text and "final:" in text
    assert "reader_1 → reader_2" in text and "Lineage of final" in text
    assert f"{run_dir}/report.html" in text and f"rclc-graph inspect {run_dir}" in text
    assert (run_dir / "report.html").is_file() and len(list((run_dir / "nodes").iterdir())) == 6


def test_run_json_and_jsonl(small, tmp_path, tiny_pool):
    topology, _ = small
    lines = tmp_path / "runs.jsonl"
    second = dict(CHAIN_INPUTS, question="another question")
    lines.write_text(json.dumps(CHAIN_INPUTS) + "\n" + json.dumps(second) + "\n")
    result = invoke("run", topology, "--input", lines, "--out", tmp_path / "runs", "--json")
    assert result.exit_code == 0, result.output
    summaries = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(summaries) == 2 and summaries[0]["run_id"] != summaries[1]["run_id"]
    for summary in summaries:
        assert summary["status"] == "finished" and set(summary["outputs"]) == {"final"}
        assert [hop["target"] for hop in summary["hops"]] == ["reader_2", "final"]
        assert set(summary["lineage"]) == {"reader_1", "reader_2", "final"}
        assert read_record(summary["run_dir"])["inputs"]["question"] in (CHAIN_INPUTS["question"], "another question")


# issue 25 item 3: the command preflights each plan and loads its models once, not again in the recorded run
def test_run_preflights_and_loads_once_per_plan(small, tmp_path, tiny_pool, monkeypatch):
    from rclc_graph.executors import LocalExecutor
    from rclc_graph.run import settings as run_settings

    topology, _ = small
    lines = tmp_path / "runs.jsonl"
    lines.write_text(json.dumps(CHAIN_INPUTS) + "\n" + json.dumps(dict(CHAIN_INPUTS, question="another")) + "\n")
    calls = {"check_context": 0, "prepare": 0}
    check_context, prepare = run_settings.check_context, LocalExecutor.prepare

    def counted_check(*args, **kwargs):
        calls["check_context"] += 1
        return check_context(*args, **kwargs)

    async def counted_prepare(self, *args, **kwargs):
        calls["prepare"] += 1
        return await prepare(self, *args, **kwargs)

    monkeypatch.setattr(run_settings, "check_context", counted_check)
    monkeypatch.setattr(LocalExecutor, "prepare", counted_prepare)
    result = invoke("run", topology, "--input", lines, "--out", tmp_path / "runs", "--json")
    assert result.exit_code == 0, result.output
    assert calls == {"check_context": 2, "prepare": 1}  # one preflight per plan, one load for the command


def test_a_failed_run_exits_1_and_is_recorded(small, tmp_path, tiny_pool):
    topology, inputs = small
    # a budget of 1 cannot hold the 2 latent rows reasoning adds: the transfer into final fails
    # (a context too small for final's own prompt would be refused before the run, exit 2)
    topology.write_text(CHAIN_YAML.replace("{source: reader_2, target: final, policy: handoff}",
                                           "{source: reader_2, target: final, policy: {budget: 1, reasoning: {steps: 2}}}"))
    result = invoke("run", topology, "--input", inputs, "--out", tmp_path / "runs")
    assert result.exit_code == 1, result.output
    (run_dir,) = list((tmp_path / "runs").iterdir())
    record = read_record(run_dir)
    assert record["status"] == "failed" and record["failed_node"] == "final"
    assert "error:" in result.stdout and "not finished: final" in result.stdout
    assert "Traceback" not in result.output


def test_main_returns_exit_codes(small, capsys):
    topology, inputs = small
    assert main(["validate", str(topology)]) == 0
    assert main(["validate", str(topology), "--input", str(topology)]) == 2  # a .yaml is no input file
    assert main(["no-such-command"]) == 2


# -- Ctrl-C ------------------------------------------------------------------------------------


def test_interrupting_a_run_cancels_it_and_records_what_finished(tmp_path):
    from rich.console import Console

    plan = compile_plan(load_graph_text(CHAIN_YAML), CHAIN_INPUTS)
    executor = FakeExecutor(hang="final", interrupt=True)  # sends SIGINT once final started

    async def go(log):
        with anyio.fail_after(10):
            return await execute(plan, RunSettings.build(pool=ModelPool(), executor=executor), out=tmp_path, seed=0,
                                 topology=None, console=Console(file=log), quiet=False, run_id="ctrl-c")

    with open(tmp_path / "log.txt", "w") as log:
        record, run_dir, interrupted = anyio.run(go, log)
    assert interrupted
    assert record["status"] == "cancelled" and sorted(record["nodes"]) == ["reader_1", "reader_2"]
    assert record["unfinished"] == ["final"] and read_record(run_dir) == record
    assert executor.released == ["ctrl-c"]  # the scheduler released the run's agents
    assert "interrupted: cancelling the run" in (tmp_path / "log.txt").read_text()


# -- inspect -----------------------------------------------------------------------------------


def test_inspect_text_json_and_node(tmp_path):
    plan = compile_plan(load_graph_text(CHAIN_YAML), CHAIN_INPUTS)

    async def go():
        from rich.console import Console

        return await execute(plan, RunSettings.build(pool=ModelPool(), executor=FakeExecutor()), out=tmp_path, seed=0,
                             topology=None, console=Console(), quiet=True, run_id="i1")

    record, run_dir, _ = anyio.run(go)
    result = invoke("inspect", run_dir)
    assert result.exit_code == 0, result.output
    for expected in ("finished", "Outputs", "final: answer of final", "[red]markup[/red]", "Lineage per node",
                     "reader_2 → final", "Lineage of final", "report.html"):
        assert expected in result.stdout
    assert json.loads(invoke("inspect", run_dir, "--json").stdout) == record
    detail = invoke("inspect", run_dir, "--node", "reader_2")
    assert detail.exit_code == 0, detail.output
    for expected in ("reader_2", "agent reader, model base", "reads from: reader_1", "sends to: final", "Handoffs",
                     "in: reader_1 → reader_2", "out: reader_2 → final", "Prompt", "Output", "Lineage",
                     "nodes/reader_2.json"):
        assert expected in detail.stdout, expected
    # only what is specific to the node: not the run's outputs, nor other nodes' hops or lineage
    for absent in ("Outputs", "Lineage per node", "Lineage of final", "answer of final"):
        assert absent not in detail.stdout, absent
    data = json.loads(invoke("inspect", run_dir, "--node", "reader_2", "--json").stdout)
    assert data["node"] == "reader_2" and data["result"] == record["nodes"]["reader_2"]
    assert {(hop["source"], hop["target"]) for hop in data["hops"]} == {("reader_1", "reader_2"), ("reader_2", "final")}
    unknown = invoke("inspect", run_dir, "--node", "nobody")
    assert unknown.exit_code == 2 and "the run has no node 'nobody'" in unknown.stderr
    missing = invoke("inspect", tmp_path / "missing")
    assert missing.exit_code == 2 and "is not a directory" in missing.stderr


def test_read_inputs_labels_each_line(tmp_path):
    lines = tmp_path / "x.jsonl"
    lines.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_inputs(lines) == [(f"{lines}:1", {"a": 1}), (f"{lines}:3", {"a": 2})]


# issue 16 item 18: no --version; --input - refused; usage lines showed {topology} and <list[str]>;
# compare-runs --json had no help
def test_version_stdin_usage_lines_and_help(small):
    topology, inputs = small
    version = invoke("--version")
    assert version.exit_code == 0 and version.stdout.startswith("rclc-graph ") and ", rclc " in version.stdout
    piped = runner.invoke(app, ["validate", str(topology), "--input", "-"], input=inputs.read_text())
    assert piped.exit_code == 0 and "<stdin>: plan of" in piped.stdout, piped.output
    lines = "\n".join([inputs.read_text().strip()] * 2)
    piped = runner.invoke(app, ["validate", str(topology), "--input", "-"], input=lines)
    assert piped.exit_code == 0 and "<stdin>:2: plan of" in piped.stdout, piped.output
    empty = runner.invoke(app, ["validate", str(topology), "--input", "-"], input="")
    assert empty.exit_code == 2 and "standard input is empty" in empty.stderr
    for command in ("run", "validate", "draw", "inspect", "resume", "compare-runs", "experiment"):
        text = invoke(command, "--help").stdout
        assert "{" not in text.splitlines()[0] and "<list[str]>" not in text and "<str>" not in text, (command, text)
    assert "Usage: rclc-graph run [OPTIONS] TOPOLOGY" in invoke("run", "--help").stdout
    assert "--pin NODE=REPLICA" in invoke("run", "--help").stdout
    assert "print the comparison as JSON" in invoke("compare-runs", "--help").stdout
