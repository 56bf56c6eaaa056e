"""Structured output and constrained tool calls in graphs (issue 27), on tiny random models.

A random model writes neither JSON nor tool calls on its own, so every check here that the
output parses and matches comes from constrained decoding alone: `output_schema:` makes a
node's text a validated JSON document (read by `when: {json: ...}` conditions and
`NodeResult.json()`), a tool agent's calls always name a tool with arguments that fit its
signature (`tool_choice: required` forces the first turn to be one), and bad schemas fail
at validation, naming the field and the fix.
"""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel

from rclc_graph import Graph, ModelPool, Policy, load_graph_text
from rclc_graph.errors import GraphError, NodeFailed, OutputSchemaFailed
from rclc_graph.executors.tools import describe_function
from rclc_graph.run.scheduler import run_plan_sync
from rclc_graph.spec.models import ModelSpec
from tests.helpers import tools
from tests.helpers.tools import family_tokenizer, scripted


VERDICT = {
    "type": "object",
    "properties": {"route": {"enum": ["billing", "shipping"]}, "urgency": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["route", "urgency"],
    "additionalProperties": False,
}


class Verdict(BaseModel):
    route: Literal["billing", "shipping"]
    urgent: bool


def pool_for(model, tokenizer) -> ModelPool:
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def routed_graph(schema=VERDICT, max_new_tokens=48):
    graph = Graph("structured").input("question")
    graph.model("base")
    graph.agent("triage", model="base", max_new_tokens=max_new_tokens)
    graph.agent("writer", model="base", max_new_tokens=3)
    graph.node("triage", agent="triage", prompt="{question}", output_schema=schema, output=True)
    graph.node("billing", agent="writer", prompt="Billing: {question}", output=True)
    graph.edge("triage", "billing", Policy(mode="text"), when={"json": {"path": "route", "equals": "billing"}})
    return graph


def test_an_output_schema_node_writes_validated_json_that_conditions_read(tiny):
    model, tokenizer = tiny
    result = run_plan_sync(routed_graph().plan({"question": "Who owns Cedar?"}), pool=pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    value = result.nodes["triage"].json()
    jsonschema.validate(value, VERDICT)
    assert ("billing" in result.nodes) == (value["route"] == "billing")  # the condition read the JSON field


def test_a_pydantic_model_is_an_output_schema_in_the_builder(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    plan = routed_graph(schema=Verdict).plan({"question": "Who owns Cedar?"})
    result = run_plan_sync(plan, pool=pool_for(model, tokenizer))
    assert Verdict.model_validate(result.nodes["triage"].json())


def test_output_cut_off_by_max_new_tokens_fails_the_node_with_the_fix(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    schema = {"type": "object", "properties": {"summary": {"type": "string", "minLength": 40}}, "required": ["summary"]}
    result = run_plan_sync(routed_graph(schema=schema, max_new_tokens=6).plan({"question": "Who owns Cedar?"}),
                           pool=pool_for(model, tokenizer))
    assert result.status == "failed"
    assert "output_schema" in str(result.error) and "max_new_tokens" in str(result.error)


YAML = """
version: 1
name: bad
models: [{{name: base, source: embedded}}]
agents: [{{name: a, model: base}}]
nodes:
  - {{name: n, agent: a, output: true, {field}}}
"""


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("output_schema: {type: strnig}", "not a valid JSON Schema"),
        ("output_schema: {type: object, required: name}", "not a valid JSON Schema at required"),
        ("output_schema: {type: object, if: {type: object}}", "cannot constrain generation"),
        ("output_schema: [1, 2]", "JSON Schema object"),
        ("output_schema: {type: object}, generate: false", "generate: false"),
    ],
)
def test_bad_output_schemas_fail_at_validation_naming_the_field(field, says):
    with pytest.raises(GraphError) as error:
        load_graph_text(YAML.format(field=field))
    problem = error.value.problems[0]
    assert says in problem.message and "output_schema" in problem.message + str(problem.location)
    assert problem.fix


def test_a_function_node_refuses_output_schema():
    with pytest.raises(GraphError, match="output_schema"):
        Graph("f").function("f", "tests.helpers.tools:project_owner", output_schema={"type": "object"})


def tool_graph(tool_choice, output_schema=None, max_new_tokens=64):
    graph = Graph("tools").input("question")
    graph.model("base")
    graph.agent("support", model="base", system="You answer with tools.", max_new_tokens=max_new_tokens,
                tools=["tests.helpers.tools:project_city", "tests.helpers.tools:project_year"], tool_choice=tool_choice,
                max_tool_calls=1)
    graph.node("support", agent="support", prompt="{question}", output=True, output_schema=output_schema)
    return graph.plan({"question": "Who owns Cedar?"}, trust_code=True)


SCHEMAS = {schema["function"]["name"]: schema["function"]["parameters"] for schema in (
    describe_function(tools.project_city, "tests.helpers.tools:project_city"),
    describe_function(tools.project_year, "tests.helpers.tools:project_year"),
)}


@pytest.mark.parametrize("family", ["qwen3", "llama", None])
def test_required_makes_a_random_models_first_turn_a_call_that_fits_its_tool(tiny_tokenizer, family):
    """Whatever the family's call format (Hermes tags, Llama's "parameters", the plain JSON the
    description asks for), the grammar gives a call the loop parses, of a known tool, with
    arguments that validate against that tool's schema. (Both tools take bounded arguments: a
    free string could run past max_new_tokens on random weights.)"""
    from rclc import testing

    model, _ = testing.tiny_model("llama" if family == "llama" else "qwen3", tokenizer=tiny_tokenizer)
    tokenizer = family_tokenizer(tiny_tokenizer, family)
    result = run_plan_sync(tool_graph("required"), pool=pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    [call] = result.nodes["support"].tool_calls
    assert call["name"] in SCHEMAS and not (call["error"] or "").startswith(("bad arguments", "unknown tool"))
    jsonschema.validate(call["arguments"], {**SCHEMAS[call["name"]], "additionalProperties": False})
    # the calls are spent (max_tool_calls: 1): the last turn is an answer, never another call
    assert not result.nodes["support"].text.startswith(("{", "<"))


def test_auto_lets_the_model_call_or_answer(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    result = run_plan_sync(tool_graph("auto"), pool=pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    node = result.nodes["support"]
    if node.tool_calls:
        [call] = node.tool_calls
        jsonschema.validate(call["arguments"], {**SCHEMAS[call["name"]], "additionalProperties": False})
    else:
        assert not node.text.startswith(("{", "<"))


def test_a_tool_agent_with_an_output_schema_answers_in_json(tiny_qwen3):
    """The answer turn is decoded under the node's schema; a scripted call runs first."""
    model, base_tokenizer = tiny_qwen3
    tokenizer = family_tokenizer(base_tokenizer, None)
    schema = {"type": "object", "properties": {"owner": {"enum": ["Alice", "Bob"]}}, "required": ["owner"]}
    call = json.dumps({"name": "project_city", "arguments": {"project": "Cedar"}})
    with scripted(model, tokenizer, [call, '{"owner": "Alice"}']):
        result = run_plan_sync(tool_graph("required", output_schema=schema), pool=pool_for(model, tokenizer))
    assert result.status == "finished", result.error
    node = result.nodes["support"]
    assert node.tool_calls[0]["result"] == "Oslo" and node.json() == {"owner": "Alice"}


def test_output_schema_failure_is_its_own_error_type():
    assert issubclass(OutputSchemaFailed, ValueError) and not issubclass(OutputSchemaFailed, NodeFailed)
