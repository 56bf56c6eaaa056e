"""The Python builder produces the same spec as YAML: round trips, helpers, immediate errors, schema."""

from __future__ import annotations

import json

import pytest

from rclc_graph import (
    Graph,
    GraphSpec,
    Policy,
    Reasoning,
    SpecError,
    chain_of_agents,
    debate,
    fan_out,
    hierarchical,
    json_schema,
    load_graph,
    load_graph_text,
)
from tests.paths import ROOT



def everything() -> Graph:
    graph = Graph("everything", description="uses every field at least once")
    graph.input("question", description="asked by the user").input("docs", "list[str]", default=["one", "two"])
    graph.input("style", default="short")
    graph.model("base", "embedded", dtype="float32", device="cpu")
    graph.model("big", "owner/big-model", backend="vllm", dtype="bfloat16", device="cuda:1",
                resources={"GPU": 1.0, "memory": 2.5}, replicas=2)
    graph.agent("reader", model="base", system="Read.\nKeep facts.", max_new_tokens=32, context_limit=4096)
    graph.agent("writer", model="big", temperature=0.7, top_p=0.9, seed=7, description="samples")
    graph.policy("tight", Policy(budget=64, selector="chunkkv", selector_options={"chunk_size": 4, "kernel_size": 3, "span": "sentence"},
                                 reasoning=Reasoning(steps=8, context="selected_with_request", budget=8),
                                 representation="token_ids+continuous", request="{question} ({style})"))
    graph.node("w", agent="reader", prompt="Doc {index}:\n{doc}", foreach="docs", item="doc", generate=False)
    graph.node("mid", agent="reader", prompt="{question} round {round}", description="loops")
    graph.node("final", agent="writer", prompt="{question}", output=True)
    graph.edge("w", "mid", "tight", description="compressed")
    graph.edge("mid", "mid", Policy(mode="full", reasoning=Reasoning(method="latent_mass", steps=4)), rounds=2)
    graph.edge("mid", "final", Policy(mode="text"))
    graph.limits(rounds=8, max_nodes=100)
    return graph


HELPERS = [
    lambda: chain_of_agents(4),
    lambda: chain_of_agents(2, policy=Policy(mode="text")),
    lambda: fan_out(3, policy=Policy(ratio=16, request="{question}")),
    lambda: fan_out(None),
    lambda: hierarchical(2, 3, manager_policy=Policy(mode="text")),
    lambda: debate(["pro", "con"], 3),
    lambda: debate(3, 2, policy=Policy(mode="full"), memory=False),
    everything,
]


@pytest.mark.parametrize("make", HELPERS)
def test_yaml_round_trip(make, tmp_path):
    graph = make()
    spec = graph.spec()
    text = graph.to_yaml()
    assert load_graph_text(text) == spec
    path = tmp_path / "graph.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_graph(path) == spec
    assert Graph.from_spec(spec).spec() == spec
    graph.validate()


@pytest.mark.parametrize("text", ["\x85", "a\x85b", "x\u2028y", "p\u2029", "\ufeffz", "two\nlines\x85", "tab\tand \u00e9"])
def test_yaml_round_trips_text_with_characters_yaml_reads_as_breaks(text):
    # found by test_graph_fuzz: a description of NEL (U+0085) came back as a space
    graph = Graph("odd", description=text)
    graph.input("question", description=text)
    assert load_graph_text(graph.to_yaml()) == graph.spec()


def test_yaml_is_minimal_and_readable():
    text = chain_of_agents(2).to_yaml()
    assert text.startswith("version: 1\nname: chain_of_agents\n")
    assert "question:\n    description" in text and "dtype" not in text and "resources" not in text
    assert "prompt: |-\n" in text  # multi-line prompts use block style
    assert Graph("tiny").input("question").to_yaml().count("question: str") == 1


def test_helpers_plan():
    chain = chain_of_agents(3).plan({"question": "q", "chunks": ["a", "b", "c"]})
    assert chain.order == ("worker_1", "worker_2", "worker_3", "final")
    assert not chain.node("worker_2").generate and chain.node("worker_3").prompt.endswith("c")
    assert chain.edges[0].policy.name == "handoff"
    text_chain = chain_of_agents(2, policy=Policy(mode="text")).plan({"question": "q", "chunks": ["a", "b"]})
    assert text_chain.node("worker_1").generate
    fan = fan_out(None).plan({"question": "q", "documents": ["a", "b"]})
    assert fan.levels() == (("worker[0]", "worker[1]"), ("final",))
    tree = hierarchical(2, 2).plan({"question": "q", "documents": ["a", "b", "c", "d"]})
    assert tree.senders("manager_2") == ("worker_2_1", "worker_2_2")
    assert tree.node("worker_2_2").prompt.endswith("d")
    talk = debate(["pro", "con"], 2).plan({"question": "q"})
    assert talk.order == ("pro@1", "con@1", "pro@2", "con@2", "judge")
    assert talk.senders("pro@2") == ("pro@1", "con@1")


def test_helpers_check_their_arguments():
    for call in (lambda: chain_of_agents(0), lambda: fan_out(0), lambda: hierarchical(0, 2), lambda: debate(["solo"], 2)):
        with pytest.raises(ValueError):
            call()


def test_builder_errors_name_the_field():
    with pytest.raises(SpecError) as caught:
        Graph("g").model("m").agent("a", model="m", max_new_tokens=0)
    assert caught.value.code == "E_FIELD" and caught.value.path == ("agents", 0, "max_new_tokens")
    with pytest.raises(SpecError) as caught:
        Graph("g").node("n", agent="a", prompt="{x", outptu=True)
    assert {problem.path[-1] for problem in caught.value.problems} == {"prompt", "outptu"}
    assert "did you mean 'output'" in " ".join(problem.fix for problem in caught.value.problems)
    with pytest.raises(SpecError):
        Graph("bad name")
    with pytest.raises(SpecError):
        Graph("g").input("bad-input")
    with pytest.raises(SpecError):
        Graph("g").input("round")
    with pytest.raises(SpecError):
        Graph("g").input("docs", "list[str]", default="not a list")
    with pytest.raises(SpecError):
        Graph("g").model("m", "not a source!")
    with pytest.raises(SpecError):
        Graph("g").model("m", device="gpu")
    with pytest.raises(SpecError):
        Graph("g").model("m", resources={"GPU": -1.0})
    with pytest.raises(SpecError):
        Graph("g").node("n", agent="a", item="doc")  # item without foreach
    with pytest.raises(SpecError):
        Graph("g").edge("a", "b", rounds=0)


def test_source_kinds():
    graph = Graph("g").model("a", "embedded").model("b", "./weights").model("c", "/abs/w").model("d", "~/w")
    graph.model("e", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert [model.source_kind for model in graph.spec().models] == ["embedded", "path", "path", "path", "hub"]


def test_specs_are_frozen():
    spec = chain_of_agents(2).spec()
    with pytest.raises(Exception):
        spec.name = "other"  # type: ignore[misc]


# -- JSON Schema ---------------------------------------------------------------------------------


def _refs(value, found):
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref":
                found.append(item)
            else:
                _refs(item, found)
    elif isinstance(value, list):
        for item in value:
            _refs(item, found)
    return found


@pytest.mark.parametrize("kind", ["topology", "agent", "model"])
def test_json_schema_is_self_contained(kind):
    schema = json.loads(json.dumps(json_schema(kind)))
    assert schema["$schema"].endswith("2020-12/schema") and schema["additionalProperties"] is False
    for ref in _refs(schema, []):
        assert ref.startswith("#/$defs/") and ref.split("/")[-1] in schema["$defs"]


def test_json_schema_describes_files():
    schema = json_schema()
    assert set(schema["properties"]) == set(GraphSpec.model_fields)
    assert {"type": "string", "description": "profile name or path"} in schema["properties"]["agents"]["items"]["anyOf"]
    policy = schema["$defs"]["TransferPolicy"]
    assert policy["additionalProperties"] is False and set(policy["properties"]["mode"]["enum"]) == {"state", "full", "text"}
    assert "name" in schema["$defs"]["AgentSpec"]["required"]
    assert "name" not in json_schema("agent").get("required", [])
    with pytest.raises(ValueError):
        json_schema("edge")  # type: ignore[arg-type]


def test_schema_keys_cover_the_shipped_files():
    """Every key used in the shipped YAML is a property the schema knows (no silent drift)."""
    import yaml

    schema = json_schema()
    known = set(schema["properties"])
    for definition in schema["$defs"].values():
        known |= set(definition.get("properties", {}))
    for path in list((ROOT / "topologies").glob("*.yaml")) + list((ROOT / "agents").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                for key, value in item.items():
                    named = data.get("inputs", {}) | data.get("policies", {}) | data.get("mcp_servers", {})
                    if not (path.parent.name == "topologies" and key in named):  # names the file chose
                        assert key in known, f"{path.name}: {key}"
                    if key != "output_schema":  # a JSON Schema the file wrote: its keys are JSON Schema's
                        stack.append(value)
            elif isinstance(item, list):
                stack.extend(item)


def test_yaml_reference_covers_every_field():
    from rclc_graph import spec as spec_module

    text = (ROOT / "docs" / "yaml_reference.md").read_text()
    models = [spec_module.GraphSpec, spec_module.ModelSpec, spec_module.AgentSpec, spec_module.NodeSpec,
              spec_module.EdgeSpec, spec_module.TransferPolicy, spec_module.ReasoningSpec, spec_module.InputSpec,
              spec_module.RoundsSpec, spec_module.McpServerSpec]
    missing = [f"{model.__name__}.{name}" for model in models for name in model.model_fields
               if f"`{name}`" not in text and f"{name}:" not in text]
    assert missing == []
    from rclc_graph.errors import ErrorCode

    assert [code for code in sorted(code.value for code in ErrorCode) if f"`{code}`" not in text] == []
