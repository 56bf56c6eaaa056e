"""The typed events of a run: one frozen dataclass per kind, and the one place that maps what
the scheduler and executors publish (`kind`, `payload`) to them.

Producers publish plain payloads into an `EventStream` (events.py): `await ctx.publish(kind,
payload)`. Applications read typed events instead (`rclc_graph.astream` / `stream`, the
server's Server-Sent Events, the event log of a run directory): `typed(event)` turns a stream
`Event` into one of the classes below, `to_dict()` gives its wire form (JSON; `type` names
the class, e.g. "hop.delivered") and `event_from_dict` reads the wire form back.

docs/streaming.md documents every type and field. Fields a producer adds that a class does not
declare are kept in `extra` (and written back by `to_dict`), so a newer producer never breaks
an older reader and nothing is lost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Container, Iterable, Mapping

from ..spec.bounded_json import plain
from .events import Event
from .lineage import Hop, HopRecord, required_fields
from ..errors import UsageError

TERMINAL_TYPES = ("run.finished", "run.failed", "run.cancelled", "run.waiting")
"""Types after which a run (or this attempt of it) publishes nothing more."""


@dataclass(frozen=True)
class RunEvent:
    """What every event carries: the run, its position in the stream, and extra fields."""

    type: ClassVar[str] = ""
    run_id: str
    seq: int  # strictly increasing within one stream (one attempt of a run)
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: {"type", "run_id", "seq", ...fields}, plain JSON data; `extra` fields
        follow, where they do not shadow a declared one."""
        data = self._declared()
        for key, value in self.extra.items():
            data.setdefault(key, plain(value))
        return data

    def _declared(self) -> dict[str, Any]:
        """The wire form of the declared fields, `type` first."""
        data: dict[str, Any] = {"type": self.type}
        for item in dataclasses.fields(self):
            if item.name != "extra":
                data[item.name] = plain(getattr(self, item.name))
        return data

    @classmethod
    def from_fields(cls, data: Mapping[str, Any], *, run_id: str, seq: int) -> RunEvent:
        """The event whose fields `data` holds, flat as the wire form has them; fields the class
        does not declare are kept in `extra`. UsageError naming the fields it lacks."""
        names = {item.name for item in dataclasses.fields(cls)} - {"run_id", "seq", "extra"}
        known = {key: _frozen(key, value) for key, value in data.items() if key in names}
        extra = {key: value for key, value in data.items() if key not in names}
        _check_present(cls.type, sorted(required_fields(cls)), names, data)
        return cls(run_id=run_id, seq=seq, extra=extra, **known)

    @property
    def terminal(self) -> bool:
        """Whether this event ends its stream (run finished, failed, cancelled or waiting)."""
        return self.type in TERMINAL_TYPES


# -- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStarted(RunEvent):
    """The run (or a resumed attempt of it) started; `resumed` nodes had finished before."""

    type: ClassVar[str] = "run.started"
    plan: str
    nodes: int
    resumed: int = 0


@dataclass(frozen=True)
class RunFinished(RunEvent):
    """Every node finished; `outputs` are the output nodes' texts."""

    type: ClassVar[str] = "run.finished"
    seconds: float
    outputs: Mapping[str, str]


@dataclass(frozen=True)
class RunFailed(RunEvent):
    """A node failed and the run ended (a `node.failed` event came first)."""

    type: ClassVar[str] = "run.failed"
    seconds: float
    error: str | None = None
    node: str | None = None


@dataclass(frozen=True)
class RunCancelled(RunEvent):
    """The run was cancelled; `finished` lists the nodes that finished before."""

    type: ClassVar[str] = "run.cancelled"
    finished: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunWaiting(RunEvent):
    """The run stopped to ask a human (`node` is waiting); resume it with an answer."""

    type: ClassVar[str] = "run.waiting"
    node: str
    question: str


# -- nodes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStarted(RunEvent):
    """A node's senders all settled and it started."""

    type: ClassVar[str] = "node.started"
    node: str


@dataclass(frozen=True)
class NodeFinished(RunEvent):
    """A node finished (and, in a recorded run, is on disk). `text` is None for a node that
    only reads; `lineage` summarises where its positions came from (by node, kind, hops)."""

    type: ClassVar[str] = "node.finished"
    node: str
    positions: int
    text: str | None
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    inherited_positions: int = 0
    lineage: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeSkipped(RunEvent):
    """A node none of whose inbound edges fired (or a loop round after `until` held)."""

    type: ClassVar[str] = "node.skipped"
    node: str
    reason: str


@dataclass(frozen=True)
class NodeWaiting(RunEvent):
    """A node stopped for a human's answer to `question`."""

    type: ClassVar[str] = "node.waiting"
    node: str
    question: str


@dataclass(frozen=True)
class NodeFailure(RunEvent):
    """A node failed; `edge` is the plan edge id when a handoff failed; the run fails next."""

    type: ClassVar[str] = "node.failed"
    node: str | None
    edge: int | None
    message: str


# -- handoffs, tokens, decisions, tools --------------------------------------------------------


_HOP_FIELDS = tuple(item.name for item in dataclasses.fields(HopRecord) if item.name != "generation_seconds")


@dataclass(frozen=True)
class HopDelivered(RunEvent):
    """A handoff reached its receiver, before the receiver generates. `hop` is the run record's
    hop row (`results.lineage.HopRecord`: T = total_positions, I = inherited_positions, budget,
    kept, payload bytes, selection seconds, exclusions and allocation; placement and crossed
    bytes on replica executors), and its figures read as the event's own (`event.source`,
    `event.kept_positions`); the receiver's generation seconds arrive with its `node.finished`.
    `kept` lists the delivered positions' origins as lineage segments [origin node, kind, hops,
    start, length]: which spans of which node's state survived this hop (empty for text hops).
    The wire form is flat: the hop's fields, then `kept`."""

    type: ClassVar[str] = "hop.delivered"
    hop: HopRecord
    kept: tuple[tuple[Any, ...], ...] = ()

    def __getattr__(self, name: str) -> Any:
        if name in _HOP_FIELDS:  # only called for names the event itself lacks
            return getattr(object.__getattribute__(self, "hop"), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _declared(self) -> dict[str, Any]:
        """The wire form is flat: {"type", "run_id", "seq", ...the hop's fields, "kept"}."""
        data: dict[str, Any] = {"type": self.type, "run_id": self.run_id, "seq": self.seq}
        hop = self.hop.to_dict()
        data.update((name, plain(hop[name])) for name in _HOP_FIELDS if name in hop)  # `bridge` only when set
        data["kept"] = plain(self.kept)
        return data

    @classmethod
    def from_fields(cls, data: Mapping[str, Any], *, run_id: str, seq: int) -> HopDelivered:
        """The event of a flat wire form: the hop's fields make its `HopRecord`, `kept` its segments."""
        _check_present(cls.type, required_fields(HopRecord), _HOP_FIELDS, data)
        hop = HopRecord.from_dict({name: data[name] for name in _HOP_FIELDS if name in data})
        extra = {key: value for key, value in data.items() if key not in _HOP_FIELDS and key != "kept"}
        return cls(run_id=run_id, seq=seq, extra=extra, hop=hop, kept=_frozen("kept", data.get("kept", [])))


@dataclass(frozen=True)
class TokenGenerated(RunEvent):
    """One generated token of a node (`index` from 0), as it is generated."""

    type: ClassVar[str] = "token"
    node: str
    index: int
    text: str


@dataclass(frozen=True)
class EdgeDecided(RunEvent):
    """A conditional edge's decision: whether it fired."""

    type: ClassVar[str] = "edge.decided"
    edge: int
    source: str
    target: str
    fired: bool


@dataclass(frozen=True)
class ToolCalled(RunEvent):
    """A node's agent called a tool (published before the tool runs)."""

    type: ClassVar[str] = "tool.call"
    node: str
    call_id: str
    name: str
    arguments: Any


@dataclass(frozen=True)
class ToolReturned(RunEvent):
    """A tool call's result (`error`: None, or what went wrong)."""

    type: ClassVar[str] = "tool.result"
    node: str
    call_id: str
    name: str
    result: Any
    error: str | None = None


EVENT_TYPES: dict[str, type[RunEvent]] = {
    cls.type: cls
    for cls in (RunStarted, RunFinished, RunFailed, RunCancelled, RunWaiting, NodeStarted, NodeFinished, NodeSkipped,
                NodeWaiting, NodeFailure, HopDelivered, TokenGenerated, EdgeDecided, ToolCalled, ToolReturned)
}
"""Wire type -> class, for every event a run publishes."""

__all__ = ["EVENT_TYPES", "RunEvent", *sorted(cls.__name__ for cls in EVENT_TYPES.values()), "event_from_dict", "typed"]
"""What `rclc_graph.results` re-exports: the event classes (each listed once, in EVENT_TYPES) and
the ways to read them."""


# -- the one mapping from published (kind, payload) to a type -----------------------------------

_BY_STATUS = {
    "run": {"started": RunStarted, "finished": RunFinished, "failed": RunFailed, "waiting": RunWaiting},
    "node": {"started": NodeStarted, "finished": NodeFinished, "skipped": NodeSkipped, "waiting": NodeWaiting},
    "tool": {"call": ToolCalled, "result": ToolReturned},
}
_BY_KIND = {"hop": HopDelivered, "token": TokenGenerated, "error": NodeFailure, "cancelled": RunCancelled,
            "edge": EdgeDecided}
# payload keys that name the type (status, phase) or that the type leaves to another event
_DROPPED = {"run": ("status",), "node": ("status",), "tool": ("phase",), "hop": ("generation_seconds",)}


def type_of(kind: str, payload: Mapping[str, Any]) -> type[RunEvent]:
    """The class of a published (kind, payload); ValueError naming kind and status otherwise."""
    if kind in _BY_KIND:
        return _BY_KIND[kind]
    choices = _BY_STATUS.get(kind)
    if choices is None:
        raise UsageError(f"kind: {kind!r} is not a run event kind; expected one of {sorted({*_BY_KIND, *_BY_STATUS})}")
    key = "phase" if kind == "tool" else "status"
    cls = choices.get(payload.get(key))  # type: ignore[arg-type]
    if cls is None:
        raise UsageError(f"{kind} event: {key} {payload.get(key)!r} is not one of {sorted(choices)}")
    return cls


def typed_from(kind: str, payload: Mapping[str, Any], *, run_id: str, seq: int) -> RunEvent:
    """The typed event of one published (kind, payload)."""
    cls = type_of(kind, payload)
    data = {key: value for key, value in payload.items() if key not in _DROPPED.get(kind, ())}
    return cls.from_fields(data, run_id=run_id, seq=seq)


def typed(event: Event) -> RunEvent:
    """The typed event of a stream `Event`."""
    return typed_from(event.kind, event.payload, run_id=event.run_id, seq=event.seq)


def event_from_dict(data: Mapping[str, Any]) -> RunEvent:
    """Read a wire form (`to_dict()`, a line of the event log, an SSE `data:`) back; the `id`
    that the event log and SSE put in front is the line's, not the event's, and is left out."""
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise UsageError(f"type: {kind!r} is not a run event type; expected one of {sorted(EVENT_TYPES)}")
    rest = {key: value for key, value in data.items() if key not in ("type", "run_id", "seq", "id")}
    return cls.from_fields(rest, run_id=str(data.get("run_id", "")), seq=int(data.get("seq", 0)))


def hop_payload(hop: Hop) -> dict[str, Any]:
    """What an executor publishes as a `hop` event when the receiver has its delivery: the hop
    record's figures (generation seconds come later, with the node) and the kept segments."""
    data = hop.record.to_dict()
    data.pop("generation_seconds", None)
    data["kept"] = [segment.to_list() for segment in hop.lineage.segments]
    return data


def _check_present(event_type: str, required: Iterable[str], declared: Container[str], data: Mapping[str, Any]) -> None:
    """UsageError naming, in the order of `required`, each of its fields the event declares
    and the wire form `data` lacks."""
    missing = [name for name in required if name in declared and name not in data]
    if missing:
        raise UsageError(f"{event_type} event: missing {', '.join(missing)}")


def _frozen(key: str, value: Any) -> Any:
    if key == "finished" and isinstance(value, list):
        return tuple(value)
    if key == "kept" and isinstance(value, list):
        return tuple(tuple(item) for item in value)
    return value

