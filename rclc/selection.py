"""Selection records: which source positions a handoff kept, as indices and readable spans.

Recording is opt-in (`record_selection=True`) and pure CPU bookkeeping over the state the
selector saw. Indices are authoritative; span text is decoded for people and may differ
in spacing or split multi-byte characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: selection records stay importable without torch
    import torch


@dataclass(frozen=True)
class Span:
    """A maximal run of source positions that were all kept (or all dropped) and are of one kind.

    `stop` is exclusive; `kind` is `token`, `continuous` (a received row), `latent` or
    `unknown` (a sender without token IDs); `text` is the decoded run for token spans.
    """

    start: int
    stop: int
    kept: bool
    kind: str
    text: str | None

    def inspect(self) -> dict[str, Any]:
        """A plain, JSON-serialisable copy."""
        return {"start": self.start, "stop": self.stop, "kept": self.kept, "kind": self.kind, "text": self.text}


@dataclass(frozen=True)
class Selection:
    """What one sender's handoff kept for one request (recorded with `record_selection=True`).

    `indices` are the kept source positions in ascending order (authoritative); `spans`
    partition all `source_positions` for people; `budget` is the fitted count and
    `added_latent_positions` the rows reasoning appended after selection.
    """

    source_positions: int
    budget: int
    indices: tuple[int, ...]
    spans: tuple[Span, ...]
    added_latent_positions: int = 0

    def inspect(self) -> dict[str, Any]:
        """A plain, JSON-serialisable copy."""
        return {
            "source_positions": self.source_positions,
            "budget": self.budget,
            "indices": list(self.indices),
            "spans": [span.inspect() for span in self.spans],
            "added_latent_positions": self.added_latent_positions,
        }


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
) -> Selection:
    """Group positions 0..total-1 into maximal runs of equal (kept, kind) and decode token runs."""
    kept = [False] * total
    for index in indices:
        kept[index] = True
    kinds = _kinds(total, latent_steps, token_ids)
    ids = None if token_ids is None else token_ids.tolist()
    spans: list[Span] = []
    start = 0
    for position in range(1, total + 1):
        if position < total and kept[position] == kept[start] and kinds[position] == kinds[start]:
            continue
        text = None
        if kinds[start] == "token" and tokenizer is not None and ids is not None:
            text = _decode(tokenizer, ids, start, position)
        spans.append(Span(start, position, kept[start], kinds[start], text))
        start = position
    return Selection(
        source_positions=total,
        budget=budget,
        indices=tuple(indices),
        spans=tuple(spans),
        added_latent_positions=added_latent_positions,
    )
