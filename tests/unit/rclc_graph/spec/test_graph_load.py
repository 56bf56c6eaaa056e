"""YAML loading: every class of mistake names the file, the line and the field path."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rclc_graph import GraphError, SpecError, load_agent, load_graph, load_graph_text, load_model, plan_file, read_graph, validate_file
from rclc_graph.errors import PlanError
from tests.paths import ROOT


VALID = """\
name: qa
inputs:
  question: str
models:
  - name: base
    source: embedded
agents:
  - name: reader
    model: base
nodes:
  - name: reader
    agent: reader
    prompt: "{question}"
    output: true
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def failure(path: Path, error_type: type[GraphError] = SpecError) -> GraphError:
    with pytest.raises(error_type) as caught:
        read_graph(path)
    return caught.value


def test_valid_file_loads(tmp_path):
    spec = load_graph(write(tmp_path, "qa.yaml", VALID))
    assert spec.name == "qa" and spec.nodes[0].output


def test_missing_file(tmp_path):
    error = failure(tmp_path / "nope.yaml")
    assert error.code == "E_FILE" and error.location.file.endswith("nope.yaml")


def test_directory_is_not_a_file(tmp_path):
    assert failure(tmp_path).code == "E_FILE"


def test_oversized_file(tmp_path):
    path = write(tmp_path, "big.yaml", VALID + "#" * 2000 + "\n")
    with pytest.raises(SpecError) as caught:
        read_graph(path, max_bytes=1024)
    assert caught.value.code == "E_FILE_SIZE" and "1024" in caught.value.message
    assert read_graph(path).spec.name == "qa"  # the 1 MiB default accepts it


def test_non_utf8_names_line_and_column(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes(VALID.encode() + b"description: caf\xe9\n")
    error = failure(path)
    assert error.code == "E_ENCODING"
    assert error.location.line == VALID.count("\n") + 1 and error.location.column == 17


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + VALID.encode())
    assert load_graph(path).name == "qa"


def test_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "bad.yaml", VALID.replace("    prompt: \"{question}\"", "    prompt: \"{question}\n  bad: [1,"))
    error = failure(path)
    assert error.code == "E_YAML_SYNTAX" and error.location.file == str(path) and error.location.line >= 13


def test_duplicate_key(tmp_path):
    path = write(tmp_path, "dup.yaml", VALID.replace("    model: base\n", "    model: base\n    model: other\n"))
    error = failure(path)
    assert error.code == "E_YAML_DUPLICATE"
    assert error.location.line == 10 and error.path == ("agents", 0, "model")
    assert "first at line 9" in error.message


@pytest.mark.parametrize(
    "value",
    ["!!python/object/apply:os.system ['echo hi']", "!!python/name:os.system", "!custom 3", "!!binary aGk=", "!!set {a: null}"],
)
def test_object_tags_are_refused(tmp_path, value):
    path = write(tmp_path, "tag.yaml", VALID + f"description: {value}\n")
    error = failure(path)
    assert error.code == "E_YAML_TAG" and error.location.line == VALID.count("\n") + 1
    assert error.path == ("description",)


def test_alias_bomb_is_refused(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        previous = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([previous] * 10)}]")
    path = write(tmp_path, "bomb.yaml", VALID + "description:\n" + "\n".join("  " + line for line in lines) + "\n")
    assert failure(path).code == "E_YAML_SYNTAX"


def test_merge_keys_are_refused(tmp_path):
    text = VALID.replace("  - name: reader\n    model: base\n", "  - &r {name: reader, model: base}\n  - <<: *r\n    name: other\n")
    assert failure(write(tmp_path, "merge.yaml", text)).code == "E_YAML_SYNTAX"


def test_small_aliases_work(tmp_path):
    text = VALID + "policies:\n  fast: &fast {ratio: 8}\n  same: *fast\n"
    spec = load_graph(write(tmp_path, "alias.yaml", text))
    assert spec.policies["same"].ratio == 8


@pytest.mark.parametrize("text,what", [("", "empty file"), ("- a\n- b\n", "list")])
def test_top_level_must_be_a_mapping(tmp_path, text, what):
    error = failure(write(tmp_path, "top.yaml", text))
    assert error.code == "E_FIELD" and what in error.message and error.location.line == 1


def test_unknown_field_suggests_the_right_one(tmp_path):
    path = write(tmp_path, "typo.yaml", VALID + "edges:\n  - source: reader\n    target: reader\n    policy:\n      ratoi: 4\n")
    error = failure(path)
    assert error.code == "E_FIELD"
    assert error.path == ("edges", 0, "policy", "ratoi")
    assert error.location.line == VALID.count("\n") + 5
    assert "did you mean 'ratio'" in error.fix


def test_wrong_type_is_not_coerced(tmp_path):
    path = write(tmp_path, "type.yaml", VALID.replace("    model: base\n", "    model: base\n    max_new_tokens: \"64\"\n"))
    error = failure(path)
    assert error.code == "E_FIELD" and error.path == ("agents", 0, "max_new_tokens") and error.location.line == 10
    assert "'64'" in error.message


def test_missing_required_field_points_at_its_mapping(tmp_path):
    path = write(tmp_path, "missing.yaml", VALID.replace("    agent: reader\n", ""))
    error = failure(path)
    assert error.code == "E_FIELD" and error.path == ("nodes", 0, "agent")
    assert "required" in error.message and error.location.line == 11


def test_bad_literal(tmp_path):
    text = VALID + "edges:\n  - source: reader\n    target: reader\n    policy: {mode: stat}\n"
    error = failure(write(tmp_path, "mode.yaml", text))
    assert error.code == "E_FIELD" and error.path == ("edges", 0, "policy", "mode")
    assert "'stat'" in error.message


def test_ratio_and_budget_together(tmp_path):
    text = VALID + "edges:\n  - source: reader\n    target: reader\n    policy:\n      ratio: 4\n      budget: 128\n"
    error = failure(write(tmp_path, "both.yaml", text))
    assert error.code == "E_POLICY" and error.path == ("edges", 0, "policy")
    assert error.location.line == VALID.count("\n") + 4 and "keep one" in error.fix


def test_malformed_template(tmp_path):
    error = failure(write(tmp_path, "tpl.yaml", VALID.replace('"{question}"', '"{question"')))
    assert error.code == "E_TEMPLATE" and error.path == ("nodes", 0, "prompt") and error.location.line == 13


def test_many_problems_are_reported_together(tmp_path):
    text = VALID.replace("    model: base\n", "    model: base\n    colour: red\n").replace("    output: true\n", "    output: yes please\n")
    error = failure(write(tmp_path, "many.yaml", text))
    assert len(error.problems) == 2 and {p.path[-1] for p in error.problems} == {"colour", "output"}
    assert "2 problems" in str(error)


def test_keys_are_strings_as_written(tmp_path):
    # YAML 1.1 would read `on` as True; names must stay names.
    text = VALID.replace("  question: str\n", "  question: str\n  on: str\n")
    assert "on" in load_graph(write(tmp_path, "on.yaml", text)).inputs


def test_dates_stay_text(tmp_path):
    assert load_graph(write(tmp_path, "date.yaml", VALID + "description: 2024-05-01\n")).description == "2024-05-01"


# -- profiles in separate files -------------------------------------------------------------


def test_agent_profiles_by_name_and_path(tmp_path):
    write(tmp_path, "agents/reader.yaml", "model: base\nsystem: Read.\n")
    write(tmp_path, "topologies/other/judge.yaml", "name: judge\nmodel: base\n")
    text = VALID.replace("  - name: reader\n    model: base\n", "  - reader\n  - other/judge.yaml\n")
    spec = load_graph(write(tmp_path, "topologies/qa.yaml", text))
    assert [agent.name for agent in spec.agents] == ["reader", "judge"]
    assert spec.agents[0].system == "Read."


def test_error_inside_a_profile_names_the_profile_file(tmp_path):
    profile = write(tmp_path, "agents/reader.yaml", "model: base\nmax_new_tokens: 0\n")
    text = VALID.replace("  - name: reader\n    model: base\n", "  - reader\n")
    error = failure(write(tmp_path, "qa.yaml", text))
    assert error.code == "E_FIELD" and error.location.file == str(profile) and error.location.line == 2
    assert error.path == ("agents", 0, "max_new_tokens")


def test_missing_profile(tmp_path):
    text = VALID.replace("  - name: reader\n    model: base\n", "  - nobody\n")
    error = failure(write(tmp_path, "qa.yaml", text))
    assert error.code == "E_UNKNOWN_REF" and error.location.line == 8 and "nobody" in error.message


def test_profile_reference_needs_a_directory():
    text = VALID.replace("  - name: reader\n    model: base\n", "  - reader\n")
    with pytest.raises(SpecError) as caught:
        load_graph_text(text)
    assert caught.value.code == "E_UNKNOWN_REF"


def test_model_profile_and_relative_source(tmp_path):
    write(tmp_path, "models/local.yaml", "source: ./weights\ndtype: float32\n")
    text = VALID.replace("  - name: base\n    source: embedded\n", "  - local\n  - name: base\n    source: ../shared/w\n")
    spec = load_graph(write(tmp_path, "topologies/qa.yaml", text))
    assert spec.models[0].source == str(tmp_path / "models" / "weights")
    assert spec.models[1].source == str(tmp_path / "shared" / "w")
    assert spec.models[0].source_kind == "path"


def test_standalone_profiles(tmp_path):
    agent = load_agent(write(tmp_path, "critic.yaml", "model: base\ntemperature: 0.7\ntop_p: 0.9\n"))
    assert agent.name == "critic" and not agent.greedy
    model = load_model(write(tmp_path, "hub.yaml", "source: HuggingFaceTB/SmolLM2-135M-Instruct\n"))
    assert model.source_kind == "hub"
    with pytest.raises(SpecError) as caught:
        load_agent(write(tmp_path, "bad.yaml", "model: base\ntop_p: 0.9\n"))
    assert caught.value.path == ("top_p",) or caught.value.path == ()
    assert caught.value.location.file.endswith("bad.yaml")


# -- graph-level errors also cite the file -----------------------------------------------------


def test_plan_errors_from_files_carry_lines(tmp_path):
    path = write(tmp_path, "ref.yaml", VALID.replace("    agent: reader\n", "    agent: raeder\n"))
    with pytest.raises(PlanError) as caught:
        validate_file(path)
    error = caught.value
    assert error.code == "E_UNKNOWN_REF" and error.location.line == 12 and "did you mean 'reader'" in error.fix


def test_plan_file_input_errors(tmp_path):
    path = write(tmp_path, "qa.yaml", VALID)
    with pytest.raises(PlanError) as caught:
        plan_file(path, {})
    assert caught.value.code == "E_INPUT" and caught.value.location.line == 3


@pytest.mark.parametrize("name", ["chain_of_agents", "fanout_qa", "hierarchical", "debate"])
def test_shipped_topologies_compile_with_their_example_inputs(name):
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{name}.json").read_text())
    plan = plan_file(ROOT / "topologies" / f"{name}.yaml", inputs)
    assert plan.outputs and all(node.model.source == "embedded" for node in plan.nodes)
    for node in plan.nodes:  # short prompts: these run on SmolLM2-135M (8192 positions)
        assert len(node.prompt) < 2000 and node.agent.max_new_tokens <= 128


def test_shipped_agent_profiles_load():
    for path in sorted((ROOT / "agents").glob("*.yaml")):
        assert load_agent(path).model == "base"
