"""`output_schema:`: the JSON Schema a node's output must match, checked when the spec is.

A node with `output_schema` generates under constrained decoding (its tokens are masked to
those that keep the output inside the schema: rclc.Constraint), and its text is then the
compact JSON document, validated again after generation. Here, before any model work, the
schema is checked twice, so a bad one fails at `validate` with the place and the fix:

1. against its own meta-schema (`jsonschema`, Draft 2020-12 unless `$schema` says
   otherwise): an unknown type, a `required` that is not a list, ...;
2. by the constrained decoder (llguidance), which refuses the keywords it does not
   implement (`if`/`then`, `dependentSchemas`, ...) and schemas it cannot compile.

A pydantic model class (the Python builder's form) becomes its `model_json_schema()`.
Torch-free: jsonschema is pure Python and llguidance a small compiled extension.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from ..bounded_json import depth
from ..safe_yaml import MAX_DEPTH
from .fields import spec_error

MAX_SCHEMA_CHARS = 64_000  # a schema is a shape, not data; this bounds what a file may make the decoder compile


def schema_value(value: Any) -> Any:
    """A pydantic model class as its JSON Schema; anything else as it is (checked next)."""
    if isinstance(value, type) and issubclass(value, BaseModel):
        return value.model_json_schema()
    return value


def check_output_schema(schema: Any) -> dict[str, Any]:
    """`schema` if it is a JSON Schema object the constrained decoder can use; else a spec
    error naming the problem, where it is in the schema, and the fix."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    if not isinstance(schema, dict):
        raise spec_error("E_FIELD", f"output_schema must be a JSON Schema object (a mapping), got {type(schema).__name__}",
                         "write a mapping such as {type: object, properties: {answer: {type: string}}}, "
                         "or pass a pydantic model class in Python")
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as error:
        raise spec_error("E_FIELD", f"output_schema is not JSON data ({error})",
                         "use only mappings, lists, strings, numbers, booleans and null") from None
    if len(text) > MAX_SCHEMA_CHARS or depth(schema) > MAX_DEPTH:
        raise spec_error("E_FIELD", f"output_schema is larger than {MAX_SCHEMA_CHARS} characters or nested deeper than "
                         f"{MAX_DEPTH} levels", "describe the output's shape more compactly")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as error:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise spec_error("E_FIELD", f"output_schema is not a valid JSON Schema at {where}: {error.message}",
                         "fix that keyword (see https://json-schema.org/understanding-json-schema)") from None
    from llguidance import LLMatcher  # lazy: only topologies with output_schema compile one

    grammar = LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
    problem = LLMatcher.validate_grammar(grammar)
    if problem:
        raise spec_error("E_FIELD", f"output_schema cannot constrain generation: {problem}",
                         "drop or rewrite that keyword; constrained decoding supports types, properties, required, "
                         "enum, const, anyOf/oneOf, items, string lengths and patterns, number ranges, $ref/$defs")
    return schema
