"""Bad input, case by case (issue 6, item 4): context overflow, empty inputs, unknown
selectors, ratio 0, negative budgets, non-UTF-8 files and files of several megabytes are
refused with the library's error naming file, line and field, before any model work:
through the API (plan_file, run_recorded) and the CLI (exit 2, no traceback). "Before any
model work" is checked by making every weight load fail the test: only tokenizers and
configs may be read.

Damaged snapshots in a run directory (truncated, edited, another model, another layout
version) are refused by resume with the directory unchanged: tests/unit/rclc_graph/run/test_graph_resume.py;
for single agents: tests/unit/rclc/test_agent_snapshot.py and tests/unit/rclc/test_snapshot.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc import testing
from rclc_graph import GraphError, ModelPool, Policy, plan_file, run_recorded_sync
from rclc_graph.views.cli import app
from rclc_graph.errors import PlanError, SpecError

runner = CliRunner()
LIMIT = 256  # the saved tiny model's context, so an overflow is cheap to write

TOPOLOGY = """\
version: 1
name: qa
inputs:
  question: str
  documents: list[str]
models:
  - {name: base, source: SOURCE}
agents:
  - {name: reader, model: base, max_new_tokens: 8}
nodes:
  - name: reader
    agent: reader
    foreach: documents
    item: document
    generate: false
    prompt: "Question: {question}\\nDocument: {document}"
  - name: final
    agent: reader
    output: true
    prompt: "Question: {question}\\nAnswer:"
edges:
  - source: reader
    target: final
    policy: {ratio: 4, request: "{question}"}
"""
POLICY_LINE = 24  # the line of `policy:` above
GOOD = {"question": "Who owns Cedar?", "documents": ["Cedar is owned by Alice.", "Birch is owned by Bob."]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model on disk with a 256-position context."""
    directory = tmp_path_factory.mktemp("tiny") / "model"
    model, tokenizer = testing.tiny_model("qwen3", max_positions=LIMIT)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to load a model's weights fails the test."""
    def refuse(self, spec, base_dir=None):
        raise AssertionError(f"model {spec.name!r} was loaded: the refusal came after model work began")

    monkeypatch.setattr(ModelPool, "get", refuse)


def write_topology(directory: Path, checkpoint: Path, text: str = TOPOLOGY) -> Path:
    path = directory / "qa.yaml"
    path.write_text(text.replace("SOURCE", str(checkpoint)), encoding="utf-8")
    return path


def refused(call, error_type=GraphError) -> GraphError:
    with pytest.raises(error_type) as caught:
        call()
    return caught.value


def cli(*args) -> tuple[int, str]:
    result = runner.invoke(app, [str(arg) for arg in args])
    assert "Traceback" not in result.output and not isinstance(result.exception, (AssertionError, TypeError,
                                                                                   KeyError, AttributeError)), result.output
    return result.exit_code, result.output


def run_cli(tmp_path: Path, topology: Path, inputs) -> tuple[int, str]:
    path = tmp_path / "inputs.json"
    if isinstance(inputs, bytes):
        path.write_bytes(inputs)
    else:
        path.write_text(json.dumps(inputs), encoding="utf-8")
    return cli("run", topology, "--input", path, "--out", tmp_path / "runs", "--json")


# -- context overflow ----------------------------------------------------------------------------


def test_a_prompt_that_cannot_fit_is_refused_before_any_weights_load(tmp_path, checkpoint, no_weights):
    topology = write_topology(tmp_path, checkpoint)
    inputs = {"question": "Who?", "documents": ["short", "word " * 400]}
    plan = plan_file(topology, inputs)  # planning is torch-free: it cannot count tokens
    error = refused(lambda: run_recorded_sync(plan, tmp_path / "runs", base_dir=topology.parent, pool=ModelPool()),
                    PlanError)
    assert error.code == "E_CONTEXT" and "reader[1]" in error.message and f"context limit of {LIMIT}" in error.message
    assert error.path == ("nodes", 0, "prompt")
    assert not (tmp_path / "runs").exists()  # no run directory for a run that never started
    code, output = run_cli(tmp_path, topology, inputs)
    assert code == 2 and "E_CONTEXT" in output and f"{topology}:16" in output.replace("\n", "")
    assert not (tmp_path / "runs").exists()


def test_an_agent_context_limit_above_the_model_is_refused(tmp_path, checkpoint, no_weights):
    topology = write_topology(tmp_path, checkpoint, TOPOLOGY.replace("max_new_tokens: 8}", f"max_new_tokens: 8, "
                                                                                           f"context_limit: {LIMIT * 2}}}"))
    code, output = run_cli(tmp_path, topology, GOOD)
    assert code == 2 and "E_CONTEXT" in output and "context_limit" in output


def test_a_several_megabyte_input_is_refused_before_any_weights_load(tmp_path, checkpoint, no_weights):
    topology = write_topology(tmp_path, checkpoint)
    document = "The Cedar project is owned by Alice. " * 60_000  # 2.2 MB
    code, output = run_cli(tmp_path, topology, {"question": "Who owns Cedar?", "documents": [document]})
    assert code == 2 and "E_CONTEXT" in output and "reader[0]" in output


def test_a_chat_template_that_raises_is_refused_before_any_weights_load(tmp_path, checkpoint, no_weights):
    broken = tmp_path / "broken"
    model, tokenizer = testing.tiny_model("qwen3", max_positions=LIMIT)
    tokenizer.chat_template = "{{ raise_exception('no system messages') }}"
    model.config.save_pretrained(broken)
    tokenizer.save_pretrained(broken)
    topology = write_topology(tmp_path, broken)
    code, output = run_cli(tmp_path, topology, GOOD)
    assert code == 2 and "E_TEMPLATE" in output and "no system messages" in output


# -- empty inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("inputs, field", [
    ({"question": "", "documents": ["a"]}, "question"),
    ({"question": "   ", "documents": ["a"]}, "question"),
    ({"question": "q", "documents": []}, "documents"),
    ({"documents": ["a"]}, "question"),
    ({}, "question"),
])
def test_empty_inputs_are_refused_with_the_line(tmp_path, checkpoint, no_weights, inputs, field):
    topology = write_topology(tmp_path, checkpoint)
    error = refused(lambda: plan_file(topology, inputs), PlanError)
    assert error.code == "E_INPUT" and field in str(error) and error.location is not None
    assert error.location.file == str(topology) and error.location.line > 1
    code, output = run_cli(tmp_path, topology, inputs)
    assert code == 2 and "E_INPUT" in output


def test_an_empty_request_is_refused_with_the_edge(tmp_path, checkpoint):
    topology = write_topology(tmp_path, checkpoint, TOPOLOGY.replace('request: "{question}"', 'request: "{documents[0]}"'))
    error = refused(lambda: plan_file(topology, {"question": "q", "documents": [" ", "b"]}), PlanError)
    paths = {problem.path for problem in error.problems}
    assert ("edges", 0, "policy", "request") in paths and all(p.code == "E_INPUT" for p in error.problems)


@pytest.mark.parametrize("content, message", [
    (b"", "not valid JSON"),
    (b"[]", "must be one JSON object"),
    (b'{"question": "caf\xe9"}', "not UTF-8"),
])
def test_empty_or_damaged_input_files_are_refused(tmp_path, checkpoint, no_weights, content, message):
    code, output = run_cli(tmp_path, write_topology(tmp_path, checkpoint), content)
    assert code == 2 and message in output


def test_an_input_file_with_no_runs_is_refused(tmp_path, checkpoint):
    (tmp_path / "runs.jsonl").write_text("\n\n")
    code, output = cli("run", write_topology(tmp_path, checkpoint), "--input", tmp_path / "runs.jsonl")
    assert code == 2 and "holds no runs" in output


# -- policies: unknown selectors, ratio 0, negative budgets ------------------------------------------


@pytest.mark.parametrize("policy, field, code", [
    ("{ratio: 4, selector: attention}", "selector", "E_FIELD"),
    ("{ratio: 0}", "ratio", "E_FIELD"),
    ("{ratio: -2}", "ratio", "E_FIELD"),
    ("{budget: -5}", "budget", "E_FIELD"),
    ("{budget: 0}", "budget", "E_FIELD"),
    ("{ratio: 4, reasoning: {steps: -1}}", "steps", "E_FIELD"),
    ("{ratio: 4, reasoning: {method: telepathy}}", "method", "E_FIELD"),
    ("{ratio: 4, budget: 8}", "policy", "E_POLICY"),
    ("{mode: text, ratio: 4}", "policy", "E_POLICY"),
    ("{ratio: 4, selector: 'os:system'}", "selector", "E_TRUST_CODE"),
])
def test_bad_policies_are_refused_with_line_and_field(tmp_path, checkpoint, no_weights, policy, field, code):
    topology = write_topology(tmp_path, checkpoint, TOPOLOGY.replace('{ratio: 4, request: "{question}"}', policy))
    error = refused(lambda: plan_file(topology, GOOD))
    assert error.code == code and error.location.file == str(topology), str(error)
    assert error.location.line == POLICY_LINE and field in ".".join(map(str, error.path)), str(error)
    code_, output = run_cli(tmp_path, topology, GOOD)
    assert code_ == 2 and f"{topology}:{POLICY_LINE}" in output.replace("\n", "") and code in output


@pytest.mark.parametrize("fields, field", [
    ({"ratio": 0}, "ratio"), ({"budget": -1}, "budget"), ({"selector": "attention"}, "selector"),
    ({"ratio": 2, "budget": 4}, "policy"),
])
def test_the_builder_refuses_the_same_policies_naming_the_field(fields, field):
    error = refused(lambda: Policy(**fields), SpecError)
    assert field in ".".join(map(str, error.path)), str(error)


# -- files: non-UTF-8 and several megabytes ----------------------------------------------------------


def test_a_non_utf8_agent_profile_names_its_file_line_and_column(tmp_path, checkpoint, no_weights):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "reader.yaml").write_bytes(b"model: base\nsystem: caf\xe9 reader\n")
    text = TOPOLOGY.replace("  - {name: reader, model: base, max_new_tokens: 8}", "  - reader")
    topology = write_topology(tmp_path, checkpoint, text)
    error = refused(lambda: plan_file(topology, GOOD), SpecError)
    assert error.code == "E_ENCODING" and error.location.file.endswith("reader.yaml")
    assert (error.location.line, error.location.column) == (2, 12)
    code, output = run_cli(tmp_path, topology, GOOD)
    assert code == 2 and "E_ENCODING" in output and "reader.yaml:2:12" in output.replace("\n", "")


def test_a_several_megabyte_topology_is_refused_at_once(tmp_path, checkpoint, no_weights):
    topology = write_topology(tmp_path, checkpoint)
    with topology.open("a") as handle:
        handle.write(("# " + "x" * 98 + "\n") * 50_000)  # 5 MB of comments
    error = refused(lambda: plan_file(topology, GOOD), SpecError)
    assert error.code == "E_FILE_SIZE" and error.location.file == str(topology)
    for command in ("run", "validate"):
        args = [command, topology] + (["--input", tmp_path / "in.json", "--out", tmp_path / "runs"] if command == "run" else [])
        (tmp_path / "in.json").write_text(json.dumps(GOOD))
        code, output = cli(*args)
        assert code in (1, 2) and "E_FILE_SIZE" in output, output


def test_a_several_megabyte_yaml_value_within_the_limit_still_needs_to_fit(tmp_path, checkpoint, no_weights):
    """Within the size limit, a long prompt in the file itself is a context overflow."""
    long = "Background: " + "Alice owns Cedar. " * 40_000  # 0.7 MB, under the 1 MiB limit
    topology = write_topology(tmp_path, checkpoint, TOPOLOGY.replace('"Question: {question}\\nAnswer:"', json.dumps(long)))
    code, output = run_cli(tmp_path, topology, GOOD)
    assert code == 2 and "E_CONTEXT" in output and "'final'" in output
