"""What a constrained generation must match: a JSON Schema or a Lark grammar (`Constraint`).

A backend-neutral value that rides in `Sampling(constraint=...)`. The HF backend compiles it
with llguidance and masks every disallowed token before a token is chosen
(backends/grammar_mask.py: per sequence, so one batch mixes constrained and free
sequences); the vLLM backend hands it to vLLM's own structured outputs (`json=` for a
schema, `grammar=` for Lark, which vLLM runs on llguidance too). docs/graphs.md says why
llguidance (measured against xgrammar and outlines: benchmarks/grammar_libraries.py).

JSON is generated on one line with the separators `json.dumps` writes (`", "` and `": "`,
nothing else between tokens: `JSON_OPTIONS`), the form models most often saw in training,
and a small model cannot spend its tokens on blank lines inside a document. Grammars are in
llguidance's Lark dialect, which may embed a JSON Schema with `%json { ... }`
(`Constraint.json_fragment` writes one with these options).

Torch-free; llguidance (a small Rust extension) is imported when a constraint is checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from .errors import ConstraintError

__all__ = ["Constraint", "FORMAT_TYPES", "JSON_OPTIONS", "KINDS"]

KINDS = ("json_schema", "format", "lark")
FORMAT_TYPES = ("json_schema", "const_string", "regex", "sequence", "or", "plus")
"""The node types of a `Constraint.format` tree (a subset of xgrammar's structural tags)."""

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options for every schema: one line, `json.dumps`' separators (see the module docs)."""


@dataclass(frozen=True)
class Constraint:
    """A generation constraint: `kind` "json_schema" (`source` is the schema as JSON text) or
    "lark" (`source` is a Lark grammar). Build with `Constraint.json_schema(schema)` or
    `Constraint.lark(text)`; both check the constraint compiles, so a bad one fails before
    any model work, naming the problem."""

    kind: Literal["json_schema", "format", "lark"]
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"constraint: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
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
        constraint = cls("json_schema", json.dumps(schema))  # key order kept: properties are generated in it
        constraint.check()
        return constraint

    @classmethod
    def format(cls, tree: Mapping[str, Any]) -> Constraint:
        """Output that matches a composed format: a tree in the vocabulary of xgrammar's
        structural tags, the part both backends run (see `FORMAT_TYPES`):

            {"type": "json_schema", "json_schema": {...}}     a JSON document matching a schema
            {"type": "const_string", "value": "<tool_call>"}  exactly this text
            {"type": "regex", "pattern": "[^{]..."}            text matching a regular expression
            {"type": "sequence", "elements": [...]}            one after the other
            {"type": "or", "elements": [...]}                  one of them
            {"type": "plus", "content": {...}}                 one or more times

        The HF backend runs it as a Lark grammar (`as_lark`), vLLM as a structural tag."""
        try:
            text = json.dumps(tree)
        except (TypeError, ValueError) as error:
            raise ConstraintError(f"format: not JSON data ({error})") from None
        constraint = cls("format", text)
        constraint.check()
        return constraint

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        """Output that matches a Lark grammar (llguidance's dialect; `%json {...}` embeds a
        schema). HF backend only: vLLM's structured outputs take schemas and formats."""
        constraint = cls("lark", grammar)
        constraint.check()
        return constraint

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema of a "json_schema" constraint (None for a grammar)."""
        return json.loads(self.source) if self.kind == "json_schema" else None

    @staticmethod
    def json_fragment(schema: Mapping[str, Any]) -> str:
        """`%json {...}`: a JSON Schema inside a Lark grammar, with `JSON_OPTIONS` (a schema's
        own `x-guidance` options win)."""
        options = {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}
        return "%json " + json.dumps({**schema, "x-guidance": options})

    def as_lark(self) -> str:
        """The constraint as one Lark grammar (what the HF backend's llguidance compiles)."""
        if self.kind == "lark":
            return self.source
        if self.kind == "json_schema":
            return f"start: {self.json_fragment(json.loads(self.source))}\n"
        rules: list[str] = []
        start = _lark(json.loads(self.source), rules)
        return "\n".join([f"start: {start}", *rules]) + "\n"

    def grammar(self) -> str:
        """The constraint as an llguidance grammar (what a matcher is built from)."""
        from llguidance import LLMatcher  # lazy: a compiled extension, needed only here

        if self.kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            except ValueError as error:
                raise ConstraintError(f"output_schema: {error}") from None
        return LLMatcher.grammar_from_lark(self.as_lark())

    def check(self) -> None:
        """Raise ConstraintError with llguidance's reason when the constraint does not compile
        (an unknown type, a keyword the decoder does not implement, a broken grammar)."""
        from llguidance import LLMatcher  # lazy: importing rclc does not load the grammar engine

        problem = LLMatcher.validate_grammar(self.grammar())
        if problem:
            what = {"json_schema": "output_schema", "format": "format", "lark": "grammar"}[self.kind]
            raise ConstraintError(f"{what}: the constrained decoder cannot use it: {problem}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (records, reports)."""
        return {"kind": self.kind, "source": self.source}


def _lark(node: Any, rules: list[str]) -> str:
    """A format tree node as a Lark expression; each JSON Schema gets a rule of its own in `rules`."""
    kind = node.get("type") if isinstance(node, Mapping) else None
    if kind == "json_schema" and isinstance(node.get("json_schema"), Mapping):
        name = f"json_{len(rules)}"
        rules.append(f"{name}: {Constraint.json_fragment(node['json_schema'])}")
        return name
    if kind == "const_string" and isinstance(node.get("value"), str) and node["value"]:
        return json.dumps(node["value"])
    if kind == "regex" and isinstance(node.get("pattern"), str) and node["pattern"]:
        return "/" + node["pattern"].replace("/", "\\/") + "/"
    if kind in ("sequence", "or") and isinstance(node.get("elements"), list) and node["elements"]:
        joiner = " " if kind == "sequence" else " | "
        return "(" + joiner.join(_lark(element, rules) for element in node["elements"]) + ")"
    if kind == "plus" and "content" in node:
        return f"({_lark(node['content'], rules)})+"
    raise ConstraintError(
        f"format: {json.dumps(node)[:120]} is not a format node; use one of {', '.join(FORMAT_TYPES)} with its fields "
        "(json_schema: json_schema, const_string: value, regex: pattern, sequence/or: elements, plus: content)"
    )
