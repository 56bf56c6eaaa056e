"""Errors of the graph layer: one small family, each problem with a stable code and a fix.

    GraphError            base class; holds one or more `Problem`s
    ├── SpecError         a file or a field is wrong (reading, YAML, pydantic field checks)
    └── PlanError         the graph as a whole is wrong (references, shape, policies, inputs)

A `Problem` is data: `code` (stable, for tests and tools), `message` (what is wrong),
`fix` (what to change), `path` (the field path inside the graph, e.g. ("edges", 2, "policy",
"ratio")) and `location` (file, line, column) when the graph came from YAML. One error may
carry several problems so a user sees every typo of a file at once.

Codes:

    E_FILE             a file is missing, unreadable or not a regular file
    E_FILE_SIZE        a file is larger than the loader's size limit
    E_ENCODING         a file is not valid UTF-8
    E_YAML_SYNTAX      YAML that does not parse (or too many nodes after alias expansion)
    E_YAML_DUPLICATE   the same key twice in one mapping
    E_YAML_TAG         a YAML tag that would build a non-plain value (e.g. !!python/object)
    E_FIELD            a field is unknown, missing, or has the wrong type or value
    E_DUPLICATE_NAME   two models, agents or nodes share a name (or an edge is declared twice)
    E_UNKNOWN_REF      a name that refers to nothing (model, agent, node, policy, input, file)
    E_POLICY           an edge policy that cannot work (ratio with budget, options for another mode)
    E_TRUST_CODE       a module:callable selector or method without trust_code
    E_CROSS_MODEL      a state/full edge between agents on different models
    E_TEMPLATE         a prompt or request template that is malformed or uses unknown fields
    E_NO_OUTPUT        no node is marked output: true
    E_UNREACHABLE      a node that lies on no path to an output node
    E_NO_PROMPT        a node without senders whose prompt uses no input
    E_GENERATE         generation required but disabled (output node, text edge sender)
    E_CYCLE            a cycle that is not a declared bounded loop
    E_LOOP             a malformed bounded loop (rounds on an edge that closes no loop, ...)
    E_FOREACH          a foreach over something that is not a list input, or an ambiguous edge
    E_INPUT            run inputs missing, unknown, of the wrong type, or too short
    E_TOO_LARGE        a plan with more nodes than `rounds.max_nodes` allows
    E_CONTEXT          a node's own prompt and output cannot fit its context (checked with the
                       tokenizer before any model work; see preflight.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

CODES = frozenset(
    {
        "E_FILE",
        "E_FILE_SIZE",
        "E_ENCODING",
        "E_YAML_SYNTAX",
        "E_YAML_DUPLICATE",
        "E_YAML_TAG",
        "E_FIELD",
        "E_DUPLICATE_NAME",
        "E_UNKNOWN_REF",
        "E_POLICY",
        "E_TRUST_CODE",
        "E_CROSS_MODEL",
        "E_TEMPLATE",
        "E_NO_OUTPUT",
        "E_UNREACHABLE",
        "E_NO_PROMPT",
        "E_GENERATE",
        "E_CYCLE",
        "E_LOOP",
        "E_FOREACH",
        "E_INPUT",
        "E_TOO_LARGE",
        "E_CONTEXT",
    }
)

FieldPath = tuple["str | int", ...]


@dataclass(frozen=True)
class Location:
    """Where in a file a problem sits; line and column are 1-based."""

    file: str
    line: int
    column: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def format_path(path: FieldPath) -> str:
    """("edges", 2, "policy") -> "edges[2].policy"."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    fix: str
    path: FieldPath = ()
    location: Location | None = None

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"code: {self.code!r} is not a documented error code (see rclc_graph.errors)")

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location is not None else ""
        field = f"{format_path(self.path)}: " if self.path else ""
        return f"{where}{field}{self.message} [{self.code}] (fix: {self.fix})"

    def at(self, location: Location | None) -> Problem:
        return Problem(self.code, self.message, self.fix, self.path, location)

    def to_dict(self) -> dict[str, object]:
        where = None
        if self.location is not None:
            where = {"file": self.location.file, "line": self.location.line, "column": self.location.column}
        return {
            "code": self.code,
            "message": self.message,
            "fix": self.fix,
            "path": format_path(self.path),
            "location": where,
        }


class GraphError(ValueError):
    """Base of the family. A ValueError, so callers that catch bad arguments catch it too.

    `code`, `message`, `fix`, `path` and `location` describe the first problem; `problems`
    holds them all.
    """

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        if not self.problems:
            raise ValueError("problems: a GraphError needs at least one Problem")
        first = self.problems[0]
        self.code = first.code
        self.message = first.message
        self.fix = first.fix
        self.path = first.path
        self.location = first.location
        super().__init__(self._text())

    @classmethod
    def one(cls, code: str, message: str, fix: str, path: FieldPath = (), location: Location | None = None):
        return cls([Problem(code, message, fix, tuple(path), location)])

    def _text(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        lines = [f"{len(self.problems)} problems:"] + [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)

    def codes(self) -> tuple[str, ...]:
        return tuple(problem.code for problem in self.problems)

    def with_locations(self, locate) -> GraphError:
        """The same error with each problem's location filled in by `locate(path)`."""
        return type(self)(problem.at(problem.location or locate(problem.path)) for problem in self.problems)


class SpecError(GraphError):
    """A file or a field is wrong: raised while reading YAML or building spec models."""


class PlanError(GraphError):
    """The graph as a whole is wrong: raised by validation and plan compilation."""
