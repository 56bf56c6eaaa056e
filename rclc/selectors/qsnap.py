"""QSnap: mean request attention per position, pooled (CacheBack without the support correction)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..state import SenderState
from ._common import SpanProfile, check_sender, request_profile, request_scores, select_by_request
from ._support import pool7, request_fold

NAME = "QSnap"


def qsnap(
    sender: SenderState,
    request_ids: torch.Tensor,
    budget: int,
    *,
    span_size: int = 16,
    span: str = "fixed",
    max_span: int | None = None,
    exclude: Sequence[str | None] | None = None,
    span_starts: Sequence[int] | None = None,
) -> list[int]:
    """Keep `budget` positions ranked by pooled mean request attention, in whole spans
    (`span`, `max_span` and `exclude` as in `cacheback`)."""
    return select_by_request(
        sender, request_ids, budget, span=span, span_size=span_size, max_span=max_span, exclude=exclude,
        span_starts=span_starts, name=NAME,
        score=_scores,
    )


def qsnap_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw scores, float32 `[T]`: `pool7(votes_mean)`."""
    check_sender(sender)
    return request_scores(sender, request_ids, NAME, _scores)


def _scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    return pool7(request_fold(sender, request_ids, moments=False).votes_mean())


def qsnap_profile(
    sender: SenderState,
    request_ids: torch.Tensor,
    *,
    span_size: int = 16,
    span: str = "fixed",
    max_span: int | None = None,
    exclude: Sequence[str | None] | None = None,
    span_starts: Sequence[int] | None = None,
) -> SpanProfile:
    """Scores, spans and exclusions of `qsnap` for one sender (what pooled allocation ranks)."""
    return request_profile(
        sender, request_ids, span=span, span_size=span_size, max_span=max_span, exclude=exclude,
        span_starts=span_starts, name=NAME, score=_scores,
    )
