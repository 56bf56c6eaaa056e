"""Structured output of a node (`output_schema:`): the constraint it generates under, and the
check of what it wrote.

A node with `output_schema` generates with `rclc.Sampling(constraint=...)`: the HF backend
masks its tokens with llguidance, vLLM uses its structured outputs, an API model gets the
schema as `response_format` (json_schema, strict). Whatever the backend, the finished text is
then parsed and validated with `jsonschema` (`parse_output`): a document cut off by
`max_new_tokens` fails the node with OutputSchemaFailed saying so, never passes on broken
JSON. The node's text is the compact JSON document; `NodeResult.json()` parses it, `when:`
conditions read its fields with `{json: {path: ...}}`, and function nodes get it as text.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

import rclc

from ..errors import OutputSchemaFailed


@functools.lru_cache(maxsize=64)
def _constraint(schema_text: str) -> Any:
    return rclc.Constraint.json_schema(schema_text)


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object that does not say otherwise
    (as OpenAI's strict structured outputs require): a model may write only the properties the
    schema names, never invent keys of its own (a small model can ramble on in them)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) if key not in ("enum", "const", "default", "examples") else value
              for key, value in schema.items()}
    if "properties" in result and "additionalProperties" not in result and "patternProperties" not in result:
        result["additionalProperties"] = False
    return result


def node_constraint(schema: Mapping[str, Any] | None) -> Any:
    """The `rclc.Constraint` of an `output_schema` (closed, compiled once per schema), or None."""
    if schema is None:
        return None
    return _constraint(json.dumps(closed(schema)))  # key order kept: properties are generated in it


def parse_output(node: str, schema: Mapping[str, Any], text: str, *, max_new_tokens: int, tokens: int) -> Any:
    """The node's output parsed and validated against its schema; OutputSchemaFailed naming
    the node, the problem and the fix otherwise."""
    from jsonschema import Draft202012Validator, ValidationError
    from jsonschema.validators import validator_for

    cut = tokens >= max_new_tokens
    fix = (f"raise the agent's max_new_tokens (the output used all {max_new_tokens})" if cut
           else "check the schema: constrained decoding should not let this happen")
    try:
        value = json.loads(text)
    except ValueError as error:
        raise OutputSchemaFailed(f"node {node!r}: output_schema: the output is not complete JSON ({error}); {fix}") from None
    schema = closed(schema)
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    try:
        validator.validate(value)
    except ValidationError as error:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise OutputSchemaFailed(
            f"node {node!r}: output_schema: the output does not match the schema at {where}: {error.message}; {fix}"
        ) from None
    return value


def response_format(node_name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI `response_format` that asks an API server for JSON matching `schema`."""
    name = "".join(character if character.isalnum() or character in "_-" else "_" for character in node_name)[:64]
    return {"type": "json_schema", "json_schema": {"name": name or "output", "schema": dict(schema), "strict": True}}
