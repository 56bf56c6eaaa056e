"""Constrained generation on the vLLM backend (issue 27): `Sampling(constraint=...)` becomes
vLLM's own structured outputs (xgrammar: `json=` for a schema, a structural tag for a format);
a JSON Schema and a tool-call format (the tool loop's own, call or answer) hold on the
embedded model, the HF backend's output on the same weights validates too, and an engine set
up for another structured-outputs backend is refused with the fix."""

from __future__ import annotations

import json

import anyio
import jsonschema
import pytest
from types import SimpleNamespace


import rclc
from rclc import models
from rclc.backends.vllm import structured_outputs
from rclc_graph.executors.tool_calls import parse_tool_calls
from rclc_graph.executors.tool_grammar import format_constraint, turn_format
from tests.helpers.vllm_engines import running_engine

pytestmark = pytest.mark.vllm

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "lookup_order", "description": "Look an order up.", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string", "maxLength": 12}}, "required": ["order_id"]}}}
PROMPT = "Is the Cedar project owned by Alice? Answer in JSON."


@pytest.fixture(scope="module")
def llm():
    """The embedded model on an engine with vLLM's default structured-outputs backend ("auto")."""
    with running_engine(models.local_dir("embedded"), max_model_len=2048, kv_cache_memory_bytes=256 * 2**20) as engine:
        yield engine


def generate(agent, constraint, tokens=40):
    return anyio.run(lambda: agent.generate(PROMPT, max_new_tokens=tokens,
                                            sampling=rclc.Sampling(constraint=constraint)))


def parsed(result):
    try:
        return json.loads(result.text)
    except ValueError:
        raise AssertionError(f"not JSON: {result.text!r} {result.token_ids}") from None


def test_a_json_schema_holds_on_vllm_and_on_hf_with_the_same_weights(llm):
    constraint = rclc.Constraint.json_schema(SCHEMA)
    on_vllm = generate(rclc.bind(llm, backend="vllm"), constraint)
    jsonschema.validate(parsed(on_vllm), SCHEMA)
    model, tokenizer = models.load("embedded")
    on_hf = generate(rclc.bind(model, tokenizer), constraint)
    jsonschema.validate(parsed(on_hf), SCHEMA)


@pytest.mark.parametrize("must_call", [True, False])
def test_the_tool_loops_turn_format_holds_on_vllm(llm, must_call):
    constraint = format_constraint(turn_format([TOOL], form="json", may_call=True, must_call=must_call))
    agent = rclc.bind(llm, backend="vllm")
    result = anyio.run(lambda: agent.generate("Where is my order A-1002?", max_new_tokens=40,
                                              sampling=rclc.Sampling(constraint=constraint)))
    calls = parse_tool_calls(result.text, ["lookup_order"])
    if must_call or result.text.startswith("{"):
        assert len(calls) == 1, (result.text, result.token_ids)
        [call] = calls
        assert call.problem is None and set(call.arguments) == {"order_id"}
    else:
        assert not result.text.startswith(("{", "<")) and not calls


def test_a_lark_grammar_is_refused_on_vllm():
    with pytest.raises(rclc.ConstraintError, match="HF backend only"):
        structured_outputs(rclc.Constraint.lark('start: "yes" | "no"\n'))


def test_unconstrained_generation_on_the_same_engine_is_unchanged(llm):
    """A constrained request leaves the next free one as it was (structured outputs are per request)."""
    agent = rclc.bind(llm, backend="vllm")
    before = anyio.run(lambda: agent.generate(PROMPT, max_new_tokens=12))
    generate(rclc.bind(llm, backend="vllm"), rclc.Constraint.json_schema(SCHEMA))
    after = anyio.run(lambda: rclc.bind(llm, backend="vllm").generate(PROMPT, max_new_tokens=12))
    assert after.token_ids == before.token_ids


def test_an_engine_set_up_for_another_structured_outputs_backend_is_refused_with_the_fix():
    engine = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
        structured_outputs_config=SimpleNamespace(backend="guidance"))))
    with pytest.raises(rclc.ConstraintError, match="'backend': 'auto'"):
        structured_outputs(rclc.Constraint.json_schema(SCHEMA), engine)
