"""Selection records: which source positions a handoff kept, as indices and readable spans.

Recording is opt-in (`record_selection=True`) and pure CPU bookkeeping over the state the
selector saw. Indices are authoritative; span text is decoded for people and may differ
in spacing or split multi-byte characters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: selection records stay importable without torch
    import torch


@dataclass(frozen=True)
class Span:
    """A maximal run of source positions that were all kept (or all dropped), are of one kind
    and were passed over for one reason (or none).

    `stop` is exclusive; `kind` is `token`, `continuous` (a received row), `latent` or
    `unknown` (a sender without token IDs); `text` is the decoded run for token spans;
    `excluded` is why receiver-aware selection passed over the run (`template`,
    `instruction`, `known`; rclc.exclusion), or None. An excluded run can still be kept: the
    first position and the latent tail always are, and excluded rows fill what is left.
    """

    start: int
    stop: int
    kept: bool
    kind: str
    text: str | None
    excluded: str | None = None

    def to_list(self) -> list[Any]:
        """[start, stop, kept, kind, text, excluded]: the compact plain form `Selection.to_dict` uses."""
        return [self.start, self.stop, self.kept, self.kind, self.text, self.excluded]

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> Span:
        """The inverse of `to_list`."""
        start, stop, kept, kind, text, excluded = item
        return cls(int(start), int(stop), bool(kept), str(kind), text, None if excluded is None else str(excluded))

    def inspect(self) -> dict[str, Any]:
        """A plain, JSON-serialisable copy (its fields by name)."""
        return asdict(self)


@dataclass(frozen=True)
class Selection:
    """What one sender's handoff kept for one request (recorded with `record_selection=True`).

    `indices` are the kept source positions in ascending order (authoritative); `spans`
    partition all `source_positions` for people; `budget` is the count this sender kept
    to and `added_latent_positions` the rows reasoning appended after selection.
    `allocation` is `per_sender` (`budget` is the sender's fitted count) or `pooled`
    (`cap` is the fitted count and `budget` what the pooled ranking gave this sender).
    `bridge` is the text a bridging selector put in front of the request (None: no bridge).
    """

    source_positions: int
    budget: int
    indices: tuple[int, ...]
    spans: tuple[Span, ...]
    added_latent_positions: int = 0
    allocation: str = "per_sender"
    cap: int | None = None
    bridge: str | None = None

    @property
    def excluded(self) -> dict[str, int]:
        """Positions passed over, by reason (kept ones included: see `Span.excluded`)."""
        counts: dict[str, int] = {}
        for span in self.spans:
            if span.excluded is not None:
                counts[span.excluded] = counts.get(span.excluded, 0) + span.stop - span.start
        return counts

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data, every field as it is (`from_dict` reads it back equal): what
        moves between processes. `inspect` is the reading for people."""
        data = {
            "source_positions": self.source_positions,
            "budget": self.budget,
            "indices": list(self.indices),
            "spans": [span.to_list() for span in self.spans],
            "added_latent_positions": self.added_latent_positions,
            "allocation": self.allocation,
            "cap": self.cap,
        }
        if self.bridge is not None:  # only when a selector bridged: records without it read as before
            data["bridge"] = self.bridge
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Selection:
        """The inverse of `to_dict`."""
        return cls(
            source_positions=int(data["source_positions"]),
            budget=int(data["budget"]),
            indices=tuple(int(index) for index in data["indices"]),
            spans=tuple(Span.from_list(item) for item in data["spans"]),
            added_latent_positions=int(data["added_latent_positions"]),
            allocation=str(data["allocation"]),
            cap=None if data["cap"] is None else int(data["cap"]),
            bridge=None if data.get("bridge") is None else str(data["bridge"]),
        )

    def inspect(self) -> dict[str, Any]:
        """A plain, JSON-serialisable copy for people: spans as mappings, `cap` filled in (the
        budget when not pooled) and the positions passed over by reason."""
        data = self.to_dict()
        data["spans"] = [span.inspect() for span in self.spans]
        data["cap"] = self.budget if self.cap is None else self.cap
        data["excluded"] = self.excluded
        return data


def _kinds(total: int, latent_steps: int, token_ids: torch.Tensor | None) -> list[str]:
    ids = None if token_ids is None else token_ids.tolist()
    kinds = []
    for position in range(total):
        if position >= total - latent_steps:
            kinds.append("latent")
        elif ids is None:
            kinds.append("unknown")
        elif ids[position] == -1:
            kinds.append("continuous")
        else:
            kinds.append("token")
    return kinds


def _decode(tokenizer: Any, ids: list[int], start: int, stop: int) -> str:
    """Decode ids[start:stop]; with a token just before, decode with it and strip it to keep spacing."""
    body = ids[start:stop]
    plain = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if start == 0 or ids[start - 1] < 0:
        return plain
    context = tokenizer.decode(ids[start - 1 : start], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    joined = tokenizer.decode(ids[start - 1 : stop], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return joined[len(context) :] if joined.startswith(context) else plain


def build_selection(
    *,
    total: int,
    indices: list[int],
    budget: int,
    latent_steps: int,
    token_ids: torch.Tensor | None,
    tokenizer: Any,
    added_latent_positions: int = 0,
    excluded: Sequence[str | None] | None = None,
    allocation: str = "per_sender",
    cap: int | None = None,
    bridge: str | None = None,
) -> Selection:
    """Group positions 0..total-1 into maximal runs of equal (kept, kind, exclusion reason)
    and decode token runs."""
    kept = [False] * total
    for index in indices:
        kept[index] = True
    kinds = _kinds(total, latent_steps, token_ids)
    reasons = list(excluded) if excluded is not None else [None] * total
    ids = None if token_ids is None else token_ids.tolist()
    spans: list[Span] = []
    start = 0
    for position in range(1, total + 1):
        if (
            position < total
            and kept[position] == kept[start]
            and kinds[position] == kinds[start]
            and reasons[position] == reasons[start]
        ):
            continue
        text = None
        if kinds[start] == "token" and tokenizer is not None and ids is not None:
            text = _decode(tokenizer, ids, start, position)
        spans.append(Span(start, position, kept[start], kinds[start], text, reasons[start]))
        start = position
    return Selection(
        source_positions=total,
        budget=budget,
        indices=tuple(indices),
        spans=tuple(spans),
        added_latent_positions=added_latent_positions,
        allocation=allocation,
        cap=None if cap == budget and allocation == "per_sender" else cap,
        bridge=bridge,
    )
