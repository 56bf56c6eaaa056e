"""What a constrained generation must match: a JSON Schema or a Lark grammar (`Constraint`).

A backend-neutral value that rides in `Sampling(constraint=...)`. The HF backend compiles it
with llguidance and masks every disallowed token before a token is chosen
(backends/grammar_mask.py: per sequence, so one batch mixes constrained and free
sequences); the vLLM backend hands it to vLLM's own structured outputs (`json=` for a
schema, `grammar=` for Lark, which vLLM runs on llguidance too). docs/graphs.md says why
llguidance (measured against xgrammar and outlines: benchmarks/grammar_libraries.py).

JSON is generated compact: no whitespace between tokens (`whitespace_flexible: false`), so a
small model cannot spend its tokens on blank lines inside a document. Grammars are in
llguidance's Lark dialect, which may embed a JSON Schema with `%json { ... }`.

Torch-free; llguidance (a small Rust extension) is imported when a constraint is checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from .errors import ConstraintError

__all__ = ["Constraint", "JSON_OPTIONS"]

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
"""llguidance's JSON options for every schema: compact JSON (see the module docs)."""


@dataclass(frozen=True)
class Constraint:
    """A generation constraint: `kind` "json_schema" (`source` is the schema as JSON text) or
    "lark" (`source` is a Lark grammar). Build with `Constraint.json_schema(schema)` or
    `Constraint.lark(text)`; both check the constraint compiles, so a bad one fails before
    any model work, naming the problem."""

    kind: Literal["json_schema", "lark"]
    source: str

    def __post_init__(self) -> None:
        if self.kind not in ("json_schema", "lark"):
            raise ConstraintError(f"constraint: kind must be 'json_schema' or 'lark', got {self.kind!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConstraintError("constraint: its source must be a non-empty string (a JSON Schema or a grammar)")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> Constraint:
        """Output that parses as JSON and matches `schema` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as error:
                raise ConstraintError(f"output_schema: not JSON ({error}); pass a JSON Schema object") from None
        if not isinstance(schema, Mapping):
            raise ConstraintError(f"output_schema: expected a JSON Schema object, got {type(schema).__name__}")
        constraint = cls("json_schema", json.dumps(schema, sort_keys=True))
        constraint.check()
        return constraint

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        """Output that matches a Lark grammar (llguidance's dialect; `%json {...}` embeds a schema)."""
        constraint = cls("lark", grammar)
        constraint.check()
        return constraint

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema of a "json_schema" constraint (None for a grammar)."""
        return json.loads(self.source) if self.kind == "json_schema" else None

    def grammar(self) -> str:
        """The constraint as an llguidance grammar (what a matcher is built from)."""
        from llguidance import LLMatcher  # lazy: a compiled extension, needed only here

        if self.kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            except ValueError as error:
                raise ConstraintError(f"output_schema: {error}") from None
        return LLMatcher.grammar_from_lark(self.source)

    def check(self) -> None:
        """Raise ConstraintError with llguidance's reason when the constraint does not compile
        (an unknown type, a keyword the decoder does not implement, a broken grammar)."""
        from llguidance import LLMatcher

        problem = LLMatcher.validate_grammar(self.grammar())
        if problem:
            what = "output_schema" if self.kind == "json_schema" else "grammar"
            raise ConstraintError(f"{what}: the constrained decoder cannot use it: {problem}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (records, reports)."""
        return {"kind": self.kind, "source": self.source}
