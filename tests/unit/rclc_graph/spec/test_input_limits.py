"""Bad input that used to hang, recurse, coerce or fail after the model loaded is refused by
validation, with a located error (issue 16 items 4, 5, 6, 8, 15, 16, 17)."""

from __future__ import annotations

import importlib
import json
import math
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rclc import testing
from rclc_graph import Graph, ModelPool, Policy, load_graph_text, plan_file, validate_file
from rclc_graph.errors import GraphError, JSONLimitError, PlanError, SpecError
from rclc_graph.run import preflight
from rclc_graph.spec.bounded_json import loads
from rclc_graph.views.cli import app
from rclc_graph.views.run_inputs import read_inputs

runner = CliRunner()
LIMIT = 256

BASE = """\
version: 1
name: qa
inputs:
  question: str
models:
  - {name: base, source: SOURCE}
agents:
  - {name: reader, model: base, max_new_tokens: 8}
nodes:
  - {name: answer, agent: reader, prompt: "{question}", output: true}
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny") / "model"
    model, tokenizer = testing.tiny_model("qwen3", max_positions=LIMIT)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def no_weights(monkeypatch):
    def refuse(self, spec, base_dir=None):
        raise AssertionError(f"model {spec.name!r} was loaded: the refusal came after model work began")

    monkeypatch.setattr(ModelPool, "get", refuse)


def write(tmp_path: Path, text: str, checkpoint: Path | None = None, name: str = "qa.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("SOURCE", str(checkpoint or "embedded")), encoding="utf-8")
    return path


def problems(call) -> list:
    with pytest.raises(GraphError) as caught:
        call()
    return caught.value.problems


def cli(*args):
    result = runner.invoke(app, [str(arg) for arg in args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


# -- item 4: plan size before unrolling --------------------------------------------------------


LOOP = """\
version: 1
name: big
rounds: {limit: LIMIT, max_nodes: NODES}
inputs: {question: str}
models: [{name: base}]
agents: [{name: a, model: base}]
nodes:
  - {name: x, agent: a, prompt: "{question}"}
  - {name: y, agent: a, prompt: "{question}", output: true}
edges:
  - {source: x, target: y}
  - {source: y, target: x, rounds: ROUNDS}
"""


@pytest.fixture
def no_unrolling(monkeypatch):
    """Unrolling loops or making plan nodes fails the test: a refusal must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("the plan was being built before its size was checked")

    validation = importlib.import_module("rclc_graph.plan.validate")  # the package exports a function of that name
    monkeypatch.setattr(validation, "unroll", refuse)
    monkeypatch.setattr("rclc_graph.plan.compile.PlanNode", refuse)


# issue 16 item 4: a 500-byte YAML with rounds: 1000000 hung validate and took gigabytes
def test_a_huge_loop_is_refused_before_unrolling(tmp_path, no_unrolling):
    text = LOOP.replace("LIMIT", "1000000").replace("NODES", "100000000").replace("ROUNDS", "1000000")
    assert len(text) < 500
    tracemalloc.start()
    found = problems(lambda: validate_file(write(tmp_path, text)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 << 20
    assert {tuple(p.path) for p in found} == {("rounds", "limit"), ("rounds", "max_nodes")}  # above the caps
    assert all(p.location is not None for p in found)
    # within the caps, the size is computed, not built: 2 nodes x 1024 rounds > 1000 allowed nodes
    capped = LOOP.replace("LIMIT", "1024").replace("NODES", "1000").replace("ROUNDS", "1024")
    (problem,) = problems(lambda: validate_file(write(tmp_path, capped)))
    assert problem.code == "E_TOO_LARGE" and "2048 nodes" in problem.message


# issue 16 item 4: foreach copies are counted before they are made (nodes and edges)
def test_huge_foreach_fan_outs_are_refused_before_expanding(monkeypatch):
    graph = Graph("wide").input("docs", "list[str]")
    graph.model("base").agent("a", model="base")
    graph.node("w", agent="a", prompt="{item}", foreach="docs", generate=False)
    graph.node("v", agent="a", prompt="{item}", foreach="docs", generate=False)
    graph.node("out", agent="a", prompt="sum up", output=True)
    graph.edge("w", "out")
    graph.edge("v", "out")
    graph.limits(max_nodes=65536)
    monkeypatch.setattr("rclc_graph.plan.compile.PlanNode", lambda *a, **k: pytest.fail("a plan node was made"))
    (problem,) = problems(lambda: graph.plan({"docs": ["d"] * 40000}))
    assert problem.code == "E_TOO_LARGE" and "80001 nodes" in problem.message


# -- item 5: nesting ---------------------------------------------------------------------------


# issue 16 item 5: a YAML nested 500 deep raised RecursionError
@pytest.mark.parametrize("text", ["a: " + "[" * 500 + "]" * 500, "a:\n" + "".join("  " * i + "- \n" for i in range(300)),
                                  "a: " + "{b: " * 500 + "1" + "}" * 500])
def test_deep_yaml_is_refused_with_its_line(text):
    (problem,) = problems(lambda: load_graph_text(text))
    assert problem.code == "E_TOO_DEEP" and problem.location.line >= 1


def test_deep_nesting_through_aliases_is_refused():
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 70)]
    (problem,) = problems(lambda: load_graph_text("\n".join(lines)))
    assert problem.code in ("E_TOO_DEEP", "E_YAML_SYNTAX")


# issue 16 item 5: a 2000-deep inputs JSON raised RecursionError
def test_deep_and_duplicate_json_inputs_are_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"question": ' + "[" * 2000 + "]" * 2000 + "}")
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        read_inputs(deep)
    medium = tmp_path / "medium.json"
    medium.write_text('{"question": ' + "[" * 100 + "]" * 100 + "}")  # parses, but deeper than allowed
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        read_inputs(medium)
    # issue 16 item 17: duplicate keys were accepted silently
    twice = tmp_path / "twice.json"
    twice.write_text('{"question": "a", "question": "b"}')
    with pytest.raises(ValueError, match="key 'question' appears twice"):
        read_inputs(twice)
    with pytest.raises(JSONLimitError):
        loads("[" * 100000 + "]" * 100000)


# -- item 6: input size ------------------------------------------------------------------------


# issue 16 item 6: a 60 MB question was tokenized (178 s, 9.9 GB) before the context refusal
def test_inputs_are_refused_by_size_before_tokenizing(tmp_path, checkpoint, no_weights, monkeypatch):
    import rclc

    topology = write(tmp_path, BASE, checkpoint)
    big = {"question": "word " * (1 << 20)}  # 5 MiB
    (problem,) = problems(lambda: plan_file(topology, big))
    assert problem.code == "E_INPUT_SIZE" and "5242880 bytes" in problem.message
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    tokenized: list[int] = []
    literal = rclc.encode_literal
    monkeypatch.setattr(rclc, "encode_literal", lambda tokenizer, text: tokenized.append(len(text)) or literal(tokenizer, text))
    monkeypatch.setattr(rclc, "encode_chat", lambda *a, **k: pytest.fail("a whole prompt was tokenized"))
    code, output = cli("run", topology, "--input", path, "--out", tmp_path / "runs")
    assert code == 2 and "E_INPUT_SIZE" in output and tokenized == []  # refused before any tokenizer ran
    # a raised limit lets the text through planning; preflight then tokenizes only a prefix
    code, output = cli("run", topology, "--input", path, "--out", tmp_path / "runs", "--max-input-bytes", 10 << 20)
    assert code == 2 and "E_CONTEXT" in output and "counted on a prefix" in output
    assert 0 < sum(tokenized) < 100_000  # characters tokenized, of 5 million
    # a file that cannot hold the limit's worth of text is refused before it is parsed
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"question": "x" * (1 << 20)}))
    with pytest.raises(ValueError, match="more than one run's inputs may hold"):
        read_inputs(huge, max_input_bytes=1000)


# -- item 8: values that validated and failed after the model loaded ---------------------------


AGENT_LINE = "  - {name: reader, model: base, max_new_tokens: 8}\n"


# issue 16 item 8: `temperature: .inf`, `seed: 1e30`, a 5000-character node name and a lone surrogate in a
# description validated, then failed after the model loaded (or when the snapshot was written)
@pytest.mark.parametrize(
    ("replace", "by", "code", "path"),
    [
        (AGENT_LINE, "  - {name: reader, model: base, temperature: .inf}\n", "E_FIELD", ("agents", 0, "temperature")),
        (AGENT_LINE, "  - {name: reader, model: base, temperature: .nan}\n", "E_FIELD", ("agents", 0, "temperature")),
        (AGENT_LINE, "  - {name: reader, model: base, seed: 100000000000000000000000000000}\n", "E_FIELD",
         ("agents", 0, "seed")),
        (AGENT_LINE, "  - {name: reader, model: base, seed: 1e30}\n", "E_FIELD", ("agents", 0, "seed")),
        ("name: qa", "name: " + "q" * 5000, "E_FIELD", ("name",)),
        ("name: answer", "name: " + "n" * 5000, "E_FIELD", ("nodes", 0, "name")),  # ENAMETOOLONG at its snapshot
        ("name: qa", 'name: qa\ndescription: "bad \\ud800 text"', "E_ENCODING", ("description",)),
    ],
)
def test_values_that_failed_after_loading_are_refused_by_validation(tmp_path, replace, by, code, path):
    found = problems(lambda: validate_file(write(tmp_path, BASE.replace(replace, by))))
    assert [(p.code, tuple(p.path)) for p in found][:1] == [(code, path)]
    assert found[0].location is not None and len(found[0].message) < 300


EDGE = """\
  - {name: first, agent: reader, prompt: "{question}", generate: false}
edges:
  - source: first
    target: answer
    policy: {ratio: 4, selector: SELECTOR, selector_options: OPTIONS}
"""


# issue 16 item 8: `span_size: .nan`, `span_size: 0` and unknown `selector_options` keys failed after loading
@pytest.mark.parametrize(
    ("selector", "options", "option"),
    [
        ("cacheback", "{span_size: 0}", "span_size"),
        ("cacheback", "{span_size: .nan}", "span_size"),
        ("cacheback", "{span_size: 4, windw: 3}", "windw"),
        ("cacheback", "{span: chapter}", "span"),
        ("chunkkv", "{kernel_size: 4}", "kernel_size"),
        ("recent", "{span_size: 4}", "span_size"),
    ],
)
def test_selector_options_are_checked_at_validation(tmp_path, selector, options, option):
    text = BASE + EDGE.replace("SELECTOR", selector).replace("OPTIONS", options)
    found = problems(lambda: validate_file(write(tmp_path, text)))
    assert found[-1].code in ("E_POLICY", "E_FIELD") and found[-1].path[-1] == option and found[-1].location.line == 15


def test_a_name_too_long_for_a_file_name_and_a_surrogate_from_the_builder():
    graph = Graph("g").input("question")
    graph.model("base").agent("a", model="base")
    with pytest.raises(SpecError, match="5000 characters"):
        graph.node("n" * 5000, agent="a", prompt="{question}", output=True)
    graph.node("answer", agent="a", prompt="{question}", output=True, description="half \ud800 a character")
    (problem,) = problems(graph.validate)
    assert problem.code == "E_ENCODING" and problem.path == ("nodes", 0, "description")
    graph2 = Graph("h").input("question")
    graph2.model("base").agent("a", model="base")
    graph2.node("answer", agent="a", prompt="{question}", output=True)
    (problem,) = problems(lambda: graph2.plan({"question": "bad \ud800"}))
    assert problem.code == "E_ENCODING" and problem.path == ("inputs", "question")


# issue 16 item 8: `validate --input` skipped the tokenizer context check `run` does
def test_validate_with_inputs_runs_the_context_check(tmp_path, checkpoint, no_weights):
    topology = write(tmp_path, BASE, checkpoint)
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"question": "word " * 400}))
    code, output = cli("validate", topology, "--input", path)
    assert code == 1 and "E_CONTEXT" in output and f"{topology}:" in output.replace("\n", "")


# -- item 15: profile paths ----------------------------------------------------------------------


# issue 16 item 15: agents: ["/etc/shadow"] was read and echoed line by line
@pytest.mark.parametrize("reference", ["/etc/passwd", "../../outside/agent.yaml"])
def test_profile_paths_stay_in_the_topology_tree(tmp_path, reference):
    project = tmp_path / "a" / "b"
    project.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "agent.yaml").write_text("name: reader\nmodel: base\n")
    text = BASE.replace(AGENT_LINE, f"  - {reference}\n")
    topology = write(project, text)
    (problem,) = problems(lambda: validate_file(topology))
    assert problem.code == "E_PATH" and problem.path == ("agents", 0) and "root:" not in problem.message
    assert "passwd" not in problem.fix
    if reference.startswith(".."):
        assert validate_file(topology, trust_code=True).spec.agents[0].name == "reader"  # trusted: read


def test_profiles_next_to_and_one_level_above_the_topology_still_load(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "reader.yaml").write_text("model: base\nmax_new_tokens: 8\n")
    (tmp_path / "topologies").mkdir()
    text = BASE.replace(AGENT_LINE, "  - reader\n")
    assert validate_file(write(tmp_path / "topologies", text)).spec.agents[0].name == "reader"


# -- item 16: YAML 1.2 values --------------------------------------------------------------------


# issue 16 item 16: `output: yes` became true and `ratio: 1:30` became 90
def test_values_are_read_as_yaml_1_2_core_schema(tmp_path):
    text = BASE.replace('output: true}', 'output: yes}')
    (problem,) = problems(lambda: validate_file(write(tmp_path, text)))
    assert problem.path == ("nodes", 0, "output") and "'yes'" in problem.message
    ratio = BASE + EDGE.replace("selector: SELECTOR, selector_options: OPTIONS", "selector: cacheback").replace(
        "ratio: 4", "ratio: 1:30")
    (problem,) = problems(lambda: validate_file(write(tmp_path, ratio)))
    assert problem.path == ("edges", 0, "policy", "ratio") and "'1:30'" in problem.message
    octal = BASE.replace("max_new_tokens: 8", "max_new_tokens: 010")
    assert validate_file(write(tmp_path, octal)).spec.agents[0].max_new_tokens == 10  # decimal, not YAML 1.1 octal
    words = BASE.replace("name: qa", "name: qa\ndescription: on 2021-01-01")
    assert validate_file(write(tmp_path, words)).spec.description == "on 2021-01-01"


# -- item 17: --out ------------------------------------------------------------------------------


# issue 16 item 17: a dangling --out symlink said "already exists", --out problems came after loading
def test_out_problems_are_found_before_anything_loads(tmp_path, checkpoint, no_weights):
    topology = write(tmp_path, BASE, checkpoint)
    inputs = tmp_path / "in.json"
    inputs.write_text(json.dumps({"question": "Who owns Cedar?"}))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    code, output = cli("run", topology, "--input", inputs, "--out", dangling)
    assert code == 2 and "symbolic link" in output and "does not exist" in output and "already exists" not in output
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, output = cli("run", topology, "--input", inputs, "--out", afile)
    assert code == 2 and "is a file, not a directory" in output
    code, output = cli("run", topology, "--input", inputs, "--out", afile / "sub")
    assert code == 2 and "cannot be created" in output


def test_non_finite_numbers_are_refused_in_whole_number_fields():
    text = BASE.replace("SOURCE", "embedded").replace("max_new_tokens: 8", "max_new_tokens: .inf")
    found = problems(lambda: load_graph_text(text))
    assert {tuple(p.path) for p in found} == {("agents", 0, "max_new_tokens")}
