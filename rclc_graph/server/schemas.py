"""The JSON the HTTP API takes and gives, as pydantic models: request bodies are validated
with them (strict, unknown fields refused), and the OpenAPI document's schemas are made from
them (openapi.py), so the document cannot drift from what the handlers check."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..spec.models import MAX_NODE_TEXT_BYTES
from ..spec.safe_yaml import has_surrogate
from ..errors import ErrorCode, UsageError
from .errors import ApiError

RunStatus = Literal["queued", "starting", "running", "finished", "failed", "cancelled", "waiting", "interrupted"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StartRun(_Body):
    """POST /runs: one of `topology` (a name GET /topologies lists) or `yaml` (a topology's text)."""

    topology: Optional[str] = Field(None, description="name of a topology in the server's directory")
    yaml: Optional[str] = Field(None, description="an uploaded topology (YAML text, at most 1 MiB)")
    inputs: dict[str, Union[str, list[str]]] = Field(default_factory=dict, description="the run's inputs")
    seed: int = Field(0, ge=0, description="run seed (sampling nodes derive theirs from it)")

    @model_validator(mode="after")
    def _one_source(self) -> StartRun:
        if (self.topology is None) == (self.yaml is None):
            raise UsageError("give exactly one of topology (a name) or yaml (a topology's text)")
        return self


class AnswerRun(_Body):
    """POST /runs/{id}/answer: the human's answer per waiting node.

    Each answer is checked here, before the run changes state: an answer a run cannot carry
    (over MAX_NODE_TEXT_BYTES, or not valid Unicode) was accepted with 202, then failed the
    run and every resume of it, so the run could never finish."""

    answers: dict[str, str] = Field(description=f"node name -> answer text (at most {MAX_NODE_TEXT_BYTES} bytes)")

    @field_validator("answers")
    @classmethod
    def _carried(cls, answers: dict[str, str]) -> dict[str, str]:
        for node, text in answers.items():
            if has_surrogate(text):
                raise UsageError(f"the answer for {node!r} holds a lone surrogate (half of a UTF-16 character); "
                                 "send valid Unicode text")
            size = len(text.encode("utf-8"))
            if size > MAX_NODE_TEXT_BYTES:
                raise UsageError(f"the answer for {node!r} is {size} bytes, more than the {MAX_NODE_TEXT_BYTES} "
                                 "an answer may hold; answer in fewer words")
        return answers


class Links(BaseModel):
    """Where to read more of a run."""

    run: str
    events: str
    report: Optional[str] = None


class RunAccepted(BaseModel):
    """202: the run is admitted (starting now, or queued at `position`)."""

    run_id: str
    status: RunStatus
    position: Optional[int] = None
    links: Links


class RunSummary(BaseModel):
    """One run in a list."""

    run_id: str
    status: RunStatus
    graph: Optional[str] = None
    started_at: Optional[float] = None
    seconds: Optional[float] = None
    nodes: Optional[int] = None
    plan_nodes: Optional[int] = None
    outputs: Optional[dict[str, str]] = None
    error: Optional[str] = None
    report: Optional[bool] = None
    links: Links


class RunList(BaseModel):
    """GET /runs."""

    runs: list[RunSummary]


class RunDetail(BaseModel):
    """GET /runs/{id}: the server's status and the run directory's record.json (None before
    the run has a directory)."""

    run_id: str
    status: RunStatus
    error: Optional[str] = Field(None, description="why the run, or its last resume or answer, failed")
    record: Optional[dict[str, Any]]
    links: Links


class RunAction(BaseModel):
    """The answer to cancel: what happened to the run."""

    run_id: str
    status: Literal["cancelled", "cancelling"]


class Topology(BaseModel):
    """A topology of the server's directory."""

    name: str
    file: str
    valid: bool
    graph: Optional[str] = None
    description: Optional[str] = None
    inputs: Optional[dict[str, dict[str, Any]]] = None
    nodes: Optional[int] = None
    edges: Optional[int] = None
    example_inputs: Optional[dict[str, Any]] = None
    problems: Optional[list[dict[str, Any]]] = None


class TopologyList(BaseModel):
    """GET /topologies."""

    topologies: list[Topology]


class ServerState(BaseModel):
    """GET /server: admission now."""

    active: int
    queued: int
    streams: int
    max_concurrent: int
    max_queue: int
    max_streams: int
    trust_code: bool


class ErrorDetail(BaseModel):
    """Every refusal (docs/serve.md#errors)."""

    status: int
    code: str
    message: str
    fix: str
    problems: list[dict[str, Any]]


class ErrorBody(BaseModel):
    """Every error response."""

    error: ErrorDetail


MAX_COUNT_DIGITS = 18  # a count of more digits is no count (int() of 5,000 digits is slow, and never needed)


def parse_count(text: str | None) -> int | None:
    """A header or query value as a count: ASCII digits only, at most MAX_COUNT_DIGITS of them;
    None otherwise (`str.isdigit` accepts '²', which `int` then refuses with its own message)."""
    if text is None:
        return None
    text = text.strip()
    if not text or len(text) > MAX_COUNT_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def parse_body(model: type[_Body], data: Any) -> Any:
    """`data` as `model`, or 422 E_REQUEST naming every wrong field."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        lines = []
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"]) or "body"
            lines.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
        raise ApiError(422, ErrorCode.E_REQUEST, "; ".join(lines), f"send the fields of {model.__name__} (GET /openapi.json)") from None
