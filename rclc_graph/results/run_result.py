"""What a run produces: per-node results and the run's result, as plain data for records."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import OutputTooLarge
from ..spec.models import MAX_NODE_TEXT_BYTES
from .lineage import HopRecord, Lineage


def check_output_size(text: str | None) -> None:
    """OutputTooLarge when `text` is over MAX_NODE_TEXT_BYTES. Every node result is checked as
    it is made, before anything records, publishes or hands it on: a function returning 125 MB
    wrote a 125 MB record.json and report.html, and its event crashed the CLI."""
    if text is None or len(text) * 4 <= MAX_NODE_TEXT_BYTES:  # at most 4 UTF-8 bytes a character
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_NODE_TEXT_BYTES:
        raise OutputTooLarge(
            f"the node's output is {size} bytes of text, more than the {MAX_NODE_TEXT_BYTES} a node's output may "
            "hold; return or generate less (a summary, or a file's path with the data in the file)")


@dataclass
class NodeResult:
    """One finished node: its text, the shape and lineage of its state, and where its prompt sits."""

    node: str
    text: str | None  # generated text; None when the node only reads (generate: false)
    positions: int  # positions its state holds after it ran
    inherited_positions: int  # of which received from senders
    lineage: Lineage
    prompt_text: str  # the rendered prompt this node prefilled (chat template applied)
    prompt_start: int  # state index of the prompt's first token
    prompt_offsets: list[tuple[int, int]]  # char span in prompt_text of each prompt token
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    hops: list[HopRecord] = field(default_factory=list)  # the handoffs this node received
    placement: dict[str, str] | None = None  # where it ran ({"replica", "actor", "node"}); None in-process
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # a tool loop's calls, in order (tools.ToolRun)
    kind: str = "agent"  # "agent" (a model) or "function" (a Python callable; no state, no lineage)
    answer: str | None = None  # a person's answer after the node ran (interrupt: after)
    # What each position holds, as runs of (role, length): material, instruction or template
    # (executors/roles.py). None: not recorded (older records), read as all material.
    roles: tuple[tuple[str, int], ...] | None = None

    def __post_init__(self) -> None:
        check_output_size(self.text)

    @classmethod
    def stateless(cls, node: str, text: str | None, *, prompt_text: str = "", started_at: float,
                  hops: list[HopRecord], **figures: Any) -> NodeResult:
        """The result of a node that holds no state here (a function node, a node on an API
        model): no positions, no lineage, finished now. `figures` are other fields (tokens,
        seconds, kind)."""
        return cls(node=node, text=text, positions=0, inherited_positions=0, lineage=Lineage(), prompt_text=prompt_text,
                   prompt_start=0, prompt_offsets=[], started_at=started_at, finished_at=time.time(), hops=hops,
                   **figures)

    @property
    def effective_text(self) -> str:
        """What receivers, conditions and outputs read: the text, then a person's answer to an
        `interrupt: after` on its own paragraph ("" for a node that only reads)."""
        text = self.text or ""
        if self.answer is None:
            return text
        return f"{text}\n\n{self.answer}" if text else self.answer

    def json(self) -> Any:
        """The node's text parsed as JSON: the value of a node with `output_schema` (its text is
        the validated, compact JSON document). ValueError when the text is not JSON."""
        return json.loads(self.text or "")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (node files and records)."""
        return {
            "node": self.node,
            "text": self.text,
            "positions": self.positions,
            "inherited_positions": self.inherited_positions,
            "lineage": self.lineage.to_dict(),
            "lineage_summary": self.lineage.summary(),
            "prompt_text": self.prompt_text,
            "prompt_start": self.prompt_start,
            "prompt_offsets": [list(pair) for pair in self.prompt_offsets],
            "generated_tokens": self.generated_tokens,
            "generation_seconds": self.generation_seconds,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "hops": [hop.to_dict() for hop in self.hops],
            "placement": None if self.placement is None else dict(self.placement),
            "tool_calls": [dict(call) for call in self.tool_calls],
            "kind": self.kind,
            "answer": self.answer,
            "roles": None if self.roles is None else [[role, count] for role, count in self.roles],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeResult:
        """The inverse of `to_dict` (reading a node file)."""
        return cls(
            node=data["node"],
            text=data["text"],
            positions=data["positions"],
            inherited_positions=data["inherited_positions"],
            lineage=Lineage.from_dict(data["lineage"]),
            prompt_text=data["prompt_text"],
            prompt_start=data["prompt_start"],
            prompt_offsets=[tuple(pair) for pair in data["prompt_offsets"]],
            generated_tokens=data.get("generated_tokens", 0),
            generation_seconds=data.get("generation_seconds", 0.0),
            started_at=data.get("started_at", 0.0),
            finished_at=data.get("finished_at", 0.0),
            hops=[HopRecord.from_dict(hop) for hop in data.get("hops", [])],
            placement=data.get("placement"),
            tool_calls=[dict(call) for call in data.get("tool_calls", [])],
            kind=data.get("kind", "agent"),
            answer=data.get("answer"),
            roles=None if data.get("roles") is None else tuple((str(role), int(count)) for role, count in data["roles"]),
        )


@dataclass
class RunResult:
    """A whole run: status, the output nodes' texts, every node's result, every hop in plan order,
    the nodes it skipped (with why), and the people it waits for."""

    run_id: str
    status: str  # finished | failed | cancelled | waiting
    outputs: dict[str, str]
    nodes: dict[str, NodeResult]
    hops: list[HopRecord]
    error: str | None = None
    seconds: float = 0.0
    failed_node: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it did not run
    waiting: list[dict[str, Any]] = field(default_factory=list)  # [{node, question, when, output}] (status waiting)
    fired: dict[str, bool] = field(default_factory=dict)  # conditional edge "source->target" -> whether it fired

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "outputs": dict(self.outputs),
            "error": self.error,
            "failed_node": self.failed_node,
            "seconds": self.seconds,
            "hops": [hop.to_dict() for hop in self.hops],
            "nodes": {name: result.to_dict() for name, result in self.nodes.items()},
            "skipped": dict(self.skipped),
            "waiting": [dict(item) for item in self.waiting],
            "fired": dict(self.fired),
        }
