"""How much of the gold evidence survives each handoff, computed from lineage.

Pure functions over finished nodes (anything with `prompt_text`, `prompt_start`,
`prompt_offsets` and `lineage`, such as the scheduler's NodeResult) and hops (anything with
`source`, `target` and `mode`, such as HopRecord). No model is needed, so the figures can be
recomputed from a run record and tested on synthetic lineages.

    gold node(s)     the node(s) whose own rendered prompt contains the gold document (or,
                     without a gold document, the evidence sentence); when several do, only
                     those not downstream of another one count (a text receiver quoting its
                     sender is not a second reader). An answer that needs facts from several
                     documents (`items`, one (document, sentence) pair each) has a gold node
                     per fact, and its evidence tokens are the union over the facts
    evidence tokens  the gold node's prompt tokens whose character span (`prompt_offsets`)
                     overlaps the evidence sentence inside that document; the whole document
                     when no sentence is known. Their identities are the lineage origins of
                     positions `prompt_start + i`
    surviving        for every node reached from a gold node over state/full hops: how many
                     of its positions have one of those origins (node, index and kind; the hop
                     count is ignored)

Text hops end the trail: a text receiver re-reads words, not positions, so lineage cannot say
which evidence tokens it got. Nodes reached only through text hops are left out and the output
node's survival is then None ("not measurable"), never a misleading 0.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from ..results.lineage import Lineage
from ..errors import UsageError


class NodeLike(Protocol):
    prompt_text: str
    prompt_start: int
    prompt_offsets: Sequence[tuple[int, int]]
    lineage: Lineage


class HopLike(Protocol):
    source: str
    target: str
    mode: str


@dataclass(frozen=True)
class NodeSurvival:
    node: str
    depth: int  # hops from the nearest gold node (0 for a gold node itself)
    surviving: int  # evidence tokens present in the node's state

    def to_dict(self, evidence_tokens: int) -> dict[str, Any]:
        fraction = self.surviving / evidence_tokens if evidence_tokens else None
        return {"node": self.node, "depth": self.depth, "surviving": self.surviving, "fraction": fraction}


@dataclass(frozen=True)
class EvidenceSurvival:
    gold_nodes: tuple[str, ...]
    evidence_tokens: int
    nodes: tuple[NodeSurvival, ...]  # gold nodes first, then downstream nodes in breadth-first hop order
    output: str | None  # the output node, when it is reachable over state/full hops
    at_output: int | None  # evidence tokens in the output node's state; None: not measurable

    @property
    def fraction_at_output(self) -> float | None:
        if self.at_output is None or not self.evidence_tokens:
            return None
        return self.at_output / self.evidence_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "gold_nodes": list(self.gold_nodes),
            "evidence_tokens": self.evidence_tokens,
            "nodes": [node.to_dict(self.evidence_tokens) for node in self.nodes],
            "output": self.output,
            "at_output": self.at_output,
            "fraction_at_output": self.fraction_at_output,
        }


def evidence_span(prompt_text: str, evidence: str | None, document: str | None) -> tuple[int, int] | None:
    """Character span of the evidence in `prompt_text`: inside the document's first occurrence
    when the document is known (the whole document when the evidence is not); None if absent."""
    if document is not None:
        start = prompt_text.find(document)
        if start < 0:
            return None
        if evidence is None:
            return start, start + len(document)
        inner = prompt_text.find(evidence, start, start + len(document))
        return None if inner < 0 else (inner, inner + len(evidence))
    if evidence is None:
        return None
    start = prompt_text.find(evidence)
    return None if start < 0 else (start, start + len(evidence))


def evidence_token_indices(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """Indices of prompt tokens whose (start, end) character span overlaps `span`.
    Empty spans (special tokens without text) never overlap."""
    low, high = span
    return [index for index, (start, end) in enumerate(offsets) if start < end and start < high and end > low]


def evidence_survival(
    nodes: Mapping[str, NodeLike],
    hops: Sequence[HopLike],
    outputs: Sequence[str],
    *,
    evidence: str | None = None,
    document: str | None = None,
    items: Sequence[tuple[str | None, str | None]] | None = None,
) -> EvidenceSurvival | None:
    """Survival of the evidence through a finished run; None when no node read it (e.g. a
    question-only run) or nothing is known about it. `items` ((document, sentence) per fact
    the answer needs, `Case.evidence_items()`) replaces `evidence` and `document`."""
    pairs = list(items) if items is not None else [(document, evidence)]
    pairs = [(doc, sentence) for doc, sentence in pairs if doc is not None or sentence is not None]
    if not pairs:
        return None
    every_hop = _adjacency(hops, include_text=True)
    gold: list[str] = []
    origins: set[tuple[str, int, str]] = set()
    for doc, sentence in pairs:
        spans = {}
        for name, node in nodes.items():
            span = evidence_span(node.prompt_text, sentence, doc)
            if span is not None:
                spans[name] = span
        readers = [name for name in spans if not any(name in _reachable(other, every_hop) for other in spans if other != name)]
        gold.extend(name for name in readers if name not in gold)
        for name in readers:
            origins |= _origins(name, nodes[name], spans[name])
    if not gold:
        return None

    state_hops = _adjacency(hops, include_text=False)
    depth: dict[str, int] = {name: 0 for name in gold}
    queue = deque(gold)
    while queue:
        current = queue.popleft()
        for receiver in state_hops.get(current, ()):
            if receiver not in depth:
                depth[receiver] = depth[current] + 1
                queue.append(receiver)
    survivals = []
    for name, distance in depth.items():
        if name not in nodes:
            continue  # a receiver that did not finish
        count = sum(1 for origin in nodes[name].lineage if (origin.node, origin.index, origin.kind) in origins)
        survivals.append(NodeSurvival(name, distance, count))
    reached_outputs = [survival for survival in survivals if survival.node in outputs]
    output = reached_outputs[0] if reached_outputs else None
    return EvidenceSurvival(
        gold_nodes=tuple(gold),
        evidence_tokens=len(origins),
        nodes=tuple(survivals),
        output=None if output is None else output.node,
        at_output=None if output is None else output.surviving,
    )


def _origins(name: str, node: NodeLike, span: tuple[int, int]) -> set[tuple[str, int, str]]:
    """The lineage origins of `node`'s prompt tokens that overlap `span`."""
    found = set()
    for index in evidence_token_indices(node.prompt_offsets, span):
        position = node.prompt_start + index
        if position >= len(node.lineage):
            raise UsageError(
                f"node {name}: prompt token {index} sits at position {position}, past its lineage of "
                f"{len(node.lineage)} positions (prompt_start or prompt_offsets disagree with lineage)"
            )
        origin = node.lineage.origin(position)
        found.add((origin.node, origin.index, origin.kind))
    return found


def _adjacency(hops: Sequence[HopLike], *, include_text: bool) -> dict[str, list[str]]:
    adjacency: dict[str, list[str]] = {}
    for hop in hops:
        if include_text or hop.mode != "text":
            receivers = adjacency.setdefault(hop.source, [])
            if hop.target not in receivers:
                receivers.append(hop.target)
    return adjacency


def _reachable(start: str, adjacency: Mapping[str, Sequence[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(adjacency.get(start, ()))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(adjacency.get(current, ()))
    return seen
