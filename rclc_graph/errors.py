"""Every exception the graph layer raises, in one tree, and the stable codes of graph problems.

    RclcGraphError             base of everything below: catch it to catch any graph-layer error
    ├── UsageError             a Python caller passed a wrong argument; names it and the fix (a ValueError)
    ├── GraphError             what the user wrote is wrong; holds one or more `Problem`s (a ValueError)
    │   ├── SpecError          a file or a field is wrong (reading, YAML, pydantic field checks)
    │   └── PlanError          the graph as a whole is wrong (references, shape, policies, inputs)
    ├── ResumeError            a run directory cannot be resumed to an uninterrupted run's outputs (a ValueError)
    ├── StoreError             an experiment's results.jsonl is damaged or locked (a ValueError)
    ├── JSONLimitError         valid JSON nested too deeply or with a key given twice (a ValueError)
    ├── NodeFailed             a node failed; names the node, the edge and the cause
    ├── ObserverFailed         a run observer's callback raised after a node finished
    ├── OutputTooLarge         a node's output text is over MAX_NODE_TEXT_BYTES (a ValueError)
    ├── OutputSchemaFailed     a node's output does not match its output_schema (a ValueError)
    ├── CallTimedOut           a function node or tool did not return within its timeout (a TimeoutError)
    ├── RunStopped             a node's generation saw its run stopped (turned into the run's cancellation)
    ├── RemoteNodeFailure      a node failed on a replica whose exceptions cannot travel (plain data)
    ├── ApiModelFailed         a request to a `backend: openai` model failed after its retries (a RuntimeError)
    ├── ToolServerFailed       an MCP server an agent's tools come from did not start or died (a RuntimeError)
    ├── HostDied               the process or actor holding a replica is gone (a RuntimeError)
    ├── ExecutorUnavailable    the chosen executor needs a package that is not installed (an ImportError)
    ├── Interrupt              raised by a function node to stop the run for a person's answer (not an error)
    └── RequestRefused         the server refuses an HTTP request: status, code, message, fix

`node_failed(node, edge)` is the one way a layer turns an error inside a node's work into
NodeFailed. The ValueError / RuntimeError / ImportError bases are kept so callers that caught those before
still do. A `Problem` is data: `code` (an `ErrorCode`, stable for tests and tools), `message`
(what is wrong), `fix` (what to change), `path` (the field path inside the graph, e.g.
("edges", 2, "policy", "ratio")) and `location` (file, line, column) when the graph came from
YAML. One GraphError may carry several problems so a user sees every typo of a file at once.
The codes are documented once, on `ErrorCode`'s members; docs/yaml_reference.md#error-codes
shows the same table, and tests/unit/rclc_graph/test_graph_errors.py keeps the two equal.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterable, Iterator, Mapping


class ErrorCode(str, Enum):
    """The stable code of a graph problem. Members compare equal to their plain strings
    ("E_FIELD" == ErrorCode.E_FIELD), so YAML, pydantic and JSON paths can keep strings."""

    description: str

    def __new__(cls, value: str, description: str) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, value: str | ErrorCode) -> ErrorCode:
        """The member for `value`; ValueError naming the field for anything undocumented."""
        try:
            return cls(value)
        except ValueError:
            raise UsageError(f"code: {value!r} is not a documented error code (see rclc_graph.errors.ErrorCode)") from None

    E_FILE = "E_FILE", "A file is missing, unreadable or not a regular file."
    E_FILE_SIZE = "E_FILE_SIZE", "A file is larger than the size limit."
    E_ENCODING = "E_ENCODING", "A file is not valid UTF-8, or a text holds a lone surrogate (not valid Unicode)."
    E_TOO_DEEP = "E_TOO_DEEP", "YAML or JSON nested deeper than the nesting limit (64 levels)."
    E_YAML_SYNTAX = "E_YAML_SYNTAX", "YAML that does not parse, a merge key, or too many nodes after alias expansion."
    E_YAML_DUPLICATE = "E_YAML_DUPLICATE", "The same key twice in one mapping."
    E_YAML_TAG = "E_YAML_TAG", "A YAML tag that would build a non-plain value."
    E_FIELD = "E_FIELD", "A field is unknown, missing, or has the wrong type or value."
    E_DUPLICATE_NAME = "E_DUPLICATE_NAME", "Two models, agents or nodes share a name, or an edge is declared twice."
    E_UNKNOWN_REF = "E_UNKNOWN_REF", "A name that refers to nothing (model, agent, node, policy, input, profile file)."
    E_POLICY = "E_POLICY", (
        "A policy that cannot work: ratio with budget, options "
        "the mode does not use, selected reasoning without budget, a selector option the selector does not take "
        "or cannot use."
    )
    E_TRUST_CODE = "E_TRUST_CODE", (
        "A `module:callable` selector, reasoning method, scorer, router, function node or tool without trust_code."
    )
    E_CROSS_MODEL = "E_CROSS_MODEL", "A state/full edge between agents on different models."
    E_API_MODEL = "E_API_MODEL", (
        "An agent on a `backend: openai` model where local state is needed: a state/full edge, "
        "`generate: false`, tools or `context_limit`."
    )
    E_TOOLS = "E_TOOLS", "A tool-calling agent that cannot run its tool loop (a node of it with `generate: false`)."
    E_TEMPLATE = "E_TEMPLATE", "A malformed template, or one that uses unknown fields."
    E_NO_OUTPUT = "E_NO_OUTPUT", "No node is marked `output: true`."
    E_UNREACHABLE = "E_UNREACHABLE", "A node (or a round of it) that lies on no path to an output node."
    E_NO_PROMPT = "E_NO_PROMPT", "A node without senders whose prompt reads no input."
    E_GENERATE = "E_GENERATE", "Generation required but disabled (output node, sender of a text edge)."
    E_CYCLE = "E_CYCLE", "A cycle that is not a declared bounded loop."
    E_LOOP = "E_LOOP", "A malformed loop (rounds closing no loop, disagreeing rounds, above the limit)."
    E_FOREACH = "E_FOREACH", (
        "A foreach over a non-list input or over a node that cannot write a list, an item name hiding an input, "
        "or edges joining different lists."
    )
    E_INPUT = "E_INPUT", (
        "Run inputs missing, unknown, of the wrong type, too short for `{x[i]}`, or an empty foreach list."
    )
    E_TOO_LARGE = "E_TOO_LARGE", (
        "A plan with more nodes than `rounds.max_nodes` (or more edges than 16 per allowed node), "
        "found before anything is unrolled."
    )
    E_INPUT_SIZE = "E_INPUT_SIZE", "Run inputs larger than the input size limit (bytes), refused before tokenizing."
    E_PATH = "E_PATH", "A profile path outside the topology's directory tree (without trust)."
    E_FUNCTION = "E_FUNCTION", (
        "A function node with fields only agents use, or on a `state`/`full` edge (only `text` edges reach functions)."
    )
    E_INTERRUPT = "E_INTERRUPT", (
        "An interrupt that cannot work (a question without interrupt, `before` without `{answer}` in the prompt), "
        "or an answer for a node that takes none."
    )
    E_CONTEXT = "E_CONTEXT", (
        "A node whose own prompt plus `max_new_tokens` cannot fit its context (counted with "
        "the tokenizer before any model is loaded), an agent `context_limit` above its model's, a `full` edge "
        "whose senders cannot fit the receiver, or a receiver whose deliveries cannot fit with its prompt."
    )
    E_SUBGRAPH = "E_SUBGRAPH", (
        "A subgraph node that cannot work: fields a subgraph node does not use, inputs the subgraph does not "
        "declare or lacks, no single node to return, an edge its entry or returned nodes cannot take, or topology "
        "files that include each other."
    )
    # The server's own refusals (docs/serve.md#errors); a GraphError's problems keep the codes above.
    E_REQUEST = "E_REQUEST", "An HTTP body or parameter that is not what the route takes (400)."
    E_NOT_FOUND = "E_NOT_FOUND", "No such run, topology or route (404)."
    E_STATE = "E_STATE", "The run is not in a state that allows the request, e.g. resuming a finished run (409)."
    E_RESUME = "E_RESUME", "The run directory cannot be resumed to the uninterrupted run's outputs (409)."
    E_BUSY = "E_BUSY", "Admission is full: retry after the Retry-After seconds (429)."
    E_AUTH = "E_AUTH", "A missing or wrong bearer token (401)."
    E_HOST = "E_HOST", "A Host header that is not this loopback server, as DNS rebinding sends (403)."
    E_ORIGIN = "E_ORIGIN", "A state-changing request sent from another site's page (cross-site request forgery, 403)."
    E_BODY_SIZE = "E_BODY_SIZE", "A request body over the server's limit (413)."
    E_MEDIA_TYPE = "E_MEDIA_TYPE", "A POST body that is not application/json (415)."
    E_UNAVAILABLE = "E_UNAVAILABLE", "A feature this installation does not have (501)."
    E_INTERNAL = "E_INTERNAL", "A bug in the server: its log has the traceback (500)."


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
    """One thing wrong with what a user wrote: a code, what is wrong, the fix, and where."""

    code: ErrorCode
    message: str
    fix: str
    path: FieldPath = ()
    location: Location | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", ErrorCode.of(self.code))  # a documented code, as its member

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location is not None else ""
        field = f"{format_path(self.path)}: " if self.path else ""
        return f"{where}{field}{self.message} [{self.code}] (fix: {self.fix})"

    def at(self, location: Location | None) -> Problem:
        """The same problem placed at `location`."""
        return Problem(self.code, self.message, self.fix, self.path, location)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON data (`rclc-graph validate --json`)."""
        where = None
        if self.location is not None:
            where = {"file": self.location.file, "line": self.location.line, "column": self.location.column}
        return {
            "code": self.code.value,
            "message": self.message,
            "fix": self.fix,
            "path": format_path(self.path),
            "location": where,
        }


class RclcGraphError(Exception):
    """Base of every exception the graph layer raises on purpose."""


class UsageError(RclcGraphError, ValueError):
    """A Python caller passed a wrong argument (a value, a type, a combination): the message
    names the argument and the fix. A ValueError, so callers that caught ValueError still do."""


class GraphError(RclcGraphError, ValueError):
    """What the user wrote is wrong; `problems` holds every problem found, the attributes
    `code`, `message`, `fix`, `path` and `location` describe the first. A ValueError, so
    callers that catch bad arguments catch it too."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        if not self.problems:
            raise UsageError("problems: a GraphError needs at least one Problem")
        first = self.problems[0]
        self.code = first.code
        self.message = first.message
        self.fix = first.fix
        self.path = first.path
        self.location = first.location
        super().__init__(self._text())

    @classmethod
    def one(
        cls, code: ErrorCode | str, message: str, fix: str, path: FieldPath = (), location: Location | None = None
    ) -> Any:
        """An error of this class holding a single problem."""
        return cls([Problem(ErrorCode.of(code), message, fix, tuple(path), location)])

    def _text(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        lines = [f"{len(self.problems)} problems:"] + [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)

    def codes(self) -> tuple[ErrorCode, ...]:
        """The code of each problem, in order."""
        return tuple(problem.code for problem in self.problems)

    def with_locations(self, locate: Callable[[FieldPath], Location | None]) -> GraphError:
        """The same error with each problem's location filled in by `locate(path)`."""
        return type(self)(problem.at(problem.location or locate(problem.path)) for problem in self.problems)


class SpecError(GraphError):
    """A file or a field is wrong: raised while reading YAML or building spec models."""


class PlanError(GraphError):
    """The graph as a whole is wrong: raised by validation and plan compilation."""


class ResumeError(RclcGraphError, ValueError):
    """A run directory that cannot be resumed to the outputs an uninterrupted run gives."""


class StoreError(RclcGraphError, ValueError):
    """An experiment's results.jsonl cannot be used as it is (damaged line, locked by another process)."""


class JSONLimitError(RclcGraphError, ValueError):
    """Valid JSON that breaks a reading limit: nested too deeply, or a key given twice
    (spec/bounded_json.py); the message says which."""


class NodeFailed(RclcGraphError):
    """A node failed; names the node, the edge (when a handoff failed) and the cause."""

    def __init__(self, node: str, cause: BaseException, edge: Any = None) -> None:
        # `edge` is a plan.PlanEdge (or None); not imported: errors sit below every layer.
        self.node, self.cause, self.edge = node, cause, edge
        where = f"node {node!r}"
        if edge is not None:
            where += f", edge {edge.source!r} -> {edge.target!r} ({edge.policy.label})"
        super().__init__(f"{where}: {type(cause).__name__}: {cause}")


@contextmanager
def node_failed(node: str, edge: Any = None) -> Iterator[None]:
    """Inside: any error of a node's work becomes NodeFailed(node, error, edge), so every layer
    reports a failed node the same way. Errors that already say what happened pass as they are
    (NodeFailed from a deeper layer, an Interrupt asking a person), and so does cancellation
    (not an Exception)."""
    try:
        yield
    except (NodeFailed, Interrupt):
        raise
    except Exception as error:
        raise NodeFailed(node, error, edge) from error


class ObserverFailed(RclcGraphError):
    """The run's observer callback raised after a node finished (the node itself is done)."""


class OutputTooLarge(RclcGraphError, ValueError):
    """A node produced more text than a node's output may hold (`spec.models.MAX_NODE_TEXT_BYTES`);
    the node fails with it, so its record, events and report stay bounded."""


class OutputSchemaFailed(RclcGraphError, ValueError):
    """A node's output is not JSON matching its `output_schema` (constrained decoding keeps every token
    inside the schema, so this means generation was cut off: by max_new_tokens, or a stopped run)."""


class CallTimedOut(RclcGraphError, TimeoutError):
    """User code (a function node, a tool) did not return within its timeout; the run stopped
    waiting and abandoned its thread (executors/user_threads.py)."""


class RunStopped(RclcGraphError):
    """Raised inside a node's generation once its run is stopped; ends it before anything is
    recorded. Never reaches callers: the executor raises the run's cancellation instead."""


class RemoteNodeFailure(RclcGraphError):
    """A node failed on a replica whose exceptions cannot travel; `info` is the plain data
    `executors.replica.failure_info` made of it."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        super().__init__(info.get("message"))
        self.info = info


class ApiModelFailed(RclcGraphError, RuntimeError):
    """A request to a `backend: openai` model failed for good (refused connection, timeout,
    an error status) after its retries; names the model, the server and what to check."""


class ToolServerFailed(RclcGraphError, RuntimeError):
    """An MCP server an agent's tools come from could not be started, stayed silent during
    its start, or died while the run used it; names the server, what happened, its last
    stderr lines and the fix (executors/mcp_servers.py). The node that needed it fails."""

    def __init__(self, server: str, message: str, fix: str) -> None:
        super().__init__(f"{message} (fix: {fix})")
        self.server, self.fix = server, fix


class HostDied(RclcGraphError, RuntimeError):
    """The process or actor holding a replica is gone; a resume continues on a fresh one."""


class Interrupt(RclcGraphError):
    """Raised by a function node to stop the run until a person answers `question`.

    The node does not finish: the run ends with status "waiting", and resuming it with an
    answer for the node (`--answer NODE=TEXT`, `answers={NODE: TEXT}`) calls the function
    again with the answer in `inputs["answer"]`. Not an error: nothing failed.
    """

    def __init__(self, question: str) -> None:
        if not isinstance(question, str) or not question.strip():
            raise UsageError("question: an Interrupt asks a person something; pass the question as non-empty text")
        super().__init__(question)
        self.question = question


class ExecutorUnavailable(RclcGraphError, ImportError):
    """The chosen executor needs a package that is not installed (the message names the install)."""

    def __init__(self, reason: str, install: str) -> None:
        super().__init__(f"{reason}; install it with: {install}")
        self.reason, self.install = reason, install


class RequestRefused(RclcGraphError):
    """`rclc-graph serve` refuses a request: an HTTP status, a stable code (docs/serve.md#errors),
    what is wrong and the fix, and headers such as Retry-After. The server answers it as JSON."""

    def __init__(self, status: int, code: str, message: str, fix: str = "", *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.fix = status, code, message, fix
        self.headers = headers or {}
