"""The condition language of `when:` and `until:` (spec/predicates.py): what it accepts, how it
refuses (located, with a fix), its JSON Schema, and what each operator decides on a text."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from rclc_graph import GraphError, json_schema, load_graph, load_graph_text, to_yaml
from rclc_graph.spec import predicates as p
from rclc_graph.spec.predicates import Condition
from tests.paths import ROOT


class _Holder(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    when: Condition


def condition(data):
    return _Holder(when=data).when


@pytest.mark.parametrize(
    "data, text, expected",
    [
        ({"contains": "bill"}, "your bill is due", True),
        ({"contains": "Bill"}, "your bill is due", False),
        ({"contains": "Bill", "ignore_case": True}, "your bill is due", True),
        ({"matches": r"^\s*(yes|approved)\b"}, "  yes, fine", True),
        ({"matches": r"^\s*(yes|approved)\b"}, "no, not yes", False),
        ({"matches": "APPROVED", "ignore_case": True}, "approved!", True),
        ({"equals": "APPROVED"}, "  APPROVED\n", True),
        ({"equals": "APPROVED"}, "APPROVED, mostly", False),
        ({"equals": "approved", "ignore_case": True}, "Approved", True),
        ({"json": {"path": "route", "equals": "billing"}}, '{"route": "billing"}', True),
        ({"json": {"path": "route", "equals": "billing"}}, 'Sure: ```json\n{"route": "billing"}\n```', True),
        ({"json": {"path": "route", "equals": "billing"}}, '{"route": "tech"}', False),
        ({"json": {"path": "route", "equals": "billing"}}, "not json at all", False),
        ({"json": {"path": "a.b.1", "equals": 3}}, '{"a": {"b": [1, 3]}}', True),
        ({"json": {"path": "a.b.7", "equals": 3}}, '{"a": {"b": [1, 3]}}', False),
        ({"json": {"path": "n", "equals": 1}}, '{"n": true}', False),  # JSON true is not 1
        ({"json": {"path": "n", "equals": True}}, '{"n": 1}', False),
        ({"json": {"path": "n", "equals": 2}}, '{"n": 2.0}', True),
        ({"json": {"path": "n", "equals": "2"}}, '{"n": 2}', False),
        ({"json": {"path": "route", "in": ["billing", "refund"]}}, '{"route": "refund"}', True),
        ({"json": {"path": "route", "in": ["billing", "refund"]}}, '{"route": "login"}', False),
        ({"all": [{"contains": "a"}, {"contains": "b"}]}, "a b", True),
        ({"all": [{"contains": "a"}, {"contains": "c"}]}, "a b", False),
        ({"any": [{"contains": "c"}, {"contains": "b"}]}, "a b", True),
        ({"not": {"contains": "c"}}, "a b", True),
        ({"not": {"any": [{"equals": "x"}, {"matches": "^a"}]}}, "a b", False),
    ],
)
def test_each_operator_decides_on_the_text(data, text, expected):
    assert p.holds(condition(data), text) is expected


@pytest.mark.parametrize(
    "data, words",
    [
        ({"foo": 1}, "needs one of the keys"),
        ({"contains": "a", "equals": "b"}, "one operator"),
        (3, "a mapping or a module:callable"),
        ("not a router", "neither a condition mapping"),
        ({"contains": ""}, "at least 1 character"),
        ({"matches": "("}, "not an RE2 regular expression"),
        ({"matches": "(a)\\1"}, "not an RE2 regular expression"),  # backreferences: RE2 has none
        ({"matches": "x(?=y)"}, "not an RE2 regular expression"),  # nor lookarounds
        ({"matches": "(\\w{1,100}){1,100}"}, "invalid repetition size"),
        ({"matches": "a" * (p.MAX_PATTERN_CHARS + 1)}, "more than"),
        ({"json": {"path": "route"}}, "exactly one of equals and in"),
        ({"json": {"path": "a..b", "equals": 1}}, "not a dotted path"),
        ({"all": []}, "at least 1 item"),
        ({"contains": "a", "ignore_case": "yes"}, "valid boolean"),
        ({"contains": "a", "typo": 1}, "Extra inputs"),
    ],
)
def test_malformed_conditions_are_refused(data, words):
    with pytest.raises(ValidationError) as caught:
        condition(data)
    assert words in str(caught.value)


def test_bounded_repeats_and_plain_patterns_are_accepted():
    for pattern in (r"\b(bill|pay|charg)", r"a{1,3}b+", r"(ab)+c", r"^\s*(yes|no)\b", r"(?i)approved"):
        assert p.check_pattern(pattern).pattern == pattern


TOPOLOGY = """\
version: 1
name: routed
inputs: {{question: str}}
models: [{{name: base, source: embedded}}]
agents: [{{name: a, model: base}}]
nodes:
  - {{name: triage, agent: a, prompt: "{{question}}"}}
  - {{name: answer, agent: a, output: true, prompt: "Answer:"}}
edges:
  - source: triage
    target: answer
    when: {when}
"""


@pytest.mark.parametrize(
    "when, path, fix",
    [
        ("{contains: 3}", ("edges", 0, "when", "contains"), "text"),
        ("{matches: '(a)\\1'}", ("edges", 0, "when", "matches"), "no backreferences or lookarounds"),
        ("{nope: x}", ("edges", 0, "when"), "contains: text"),
        ("{not: {json: {path: x}}}", ("edges", 0, "when", "not", "json"), "equals: VALUE"),
    ],
)
def test_a_bad_condition_in_a_file_names_file_line_field_and_fix(tmp_path, when, path, fix):
    file = tmp_path / "routed.yaml"
    file.write_text(TOPOLOGY.format(when=when))
    with pytest.raises(GraphError) as caught:
        load_graph(file)
    problem = caught.value.problems[0]
    assert problem.code == "E_FIELD" and problem.path == path, problem
    assert problem.location is not None and problem.location.file == str(file) and problem.location.line >= 12
    assert fix in problem.fix


def test_conditions_round_trip_through_yaml_and_records():
    spec = load_graph_text(TOPOLOGY.format(when="{any: [{json: {path: r, in: [1, x]}}, {not: {equals: APPROVED}}]}"))
    again = load_graph_text(to_yaml(spec))
    assert again == spec
    dumped = spec.model_dump(mode="json")
    assert dumped["edges"][0]["when"]["any"][1] == {"not": {"equals": "APPROVED", "ignore_case": False}}
    assert type(spec).model_validate(dumped) == spec  # what a resume reads back from record.json
    assert p.describe(spec.edges[0].when) == {"any": [{"json": {"path": "r", "in": [1, "x"]}},
                                                      {"not": {"equals": "APPROVED"}}]}


def test_the_json_schema_describes_conditions_and_the_new_node_fields():
    schema = json_schema()
    definitions = schema["$defs"]
    for name in ("Contains", "Matches", "Equals", "Json", "JsonTest", "All", "AnyOf", "Not"):
        assert name in definitions, name
    edge = definitions["EdgeSpec"]["properties"]
    assert {"when", "until"} <= set(edge)
    assert set(definitions["All"]["properties"]) == {"all"} and set(definitions["Json"]["properties"]) == {"json"}
    node = definitions["NodeSpec"]["properties"]
    assert {"call", "interrupt", "question"} <= set(node)
    assert node["interrupt"]["anyOf"][0]["enum"] == ["before", "after"]
    text = json.dumps(schema)
    assert "package.module:callable router" in text


def test_a_shipped_topology_uses_only_known_condition_keys():
    root = ROOT
    spec = load_graph(root / "topologies" / "triage.yaml")
    assert [type(edge.when).__name__ for edge in spec.edges] == ["Matches", "Not"]


@pytest.mark.parametrize(
    "answer, target, expected",
    [(True, "b", True), (False, "b", False), ("b", "b", True), ("c", "b", False), (["a", "b"], "b", True),
     (("a",), "b", False)],
)
def test_what_a_router_answer_means_for_an_edge(answer, target, expected):
    assert p.router_fires(answer, target, "m:f") is expected


@pytest.mark.parametrize("answer", [None, 1, {"b": True}, ["a", 2]])
def test_a_router_answer_of_another_kind_is_an_error_naming_the_router(answer):
    with pytest.raises(ValueError, match="router 'm:f' returned"):
        p.router_fires(answer, "b", "m:f")


def test_routers_are_found_inside_combinations():
    found = list(p.routers(condition({"all": ["a.b:c", {"not": {"any": ["d:e", {"contains": "x"}]}}]})))
    assert found == ["a.b:c", "d:e"]
    with pytest.raises(ValueError, match="is a router"):
        p.holds(condition("a.b:c"), "text")


def test_json_is_not_read_from_huge_texts():
    assert p.read_json('{"a": 1}') == {"a": 1}
    assert p.read_json("x" * (p.MAX_JSON_CHARS + 1)) is None
    assert p.read_json("[1, 2] and more") == [1, 2]


# issue 24 item 6: a model's output nested past the recursion limit raised RecursionError in a
# json condition; too deep a value is no routing field
@pytest.mark.parametrize("text", ["[" * 100_000, "see: " + "{\"a\":" * 100_000, json.dumps({"route": [[[[[]]]]]} ) + "[" * 90_000])
def test_json_conditions_survive_any_nesting(text):
    assert p.holds(condition({"json": {"path": "route", "equals": "billing"}}), text) is False
    assert p.read_json("[" * 70 + "]" * 70) is None and p.read_json('{"route": "x", "route": "billing"}') == {"route": "billing"}
