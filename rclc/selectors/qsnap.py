"""QSnap: mean request attention per position, pooled (CacheBack without the support correction)."""

from __future__ import annotations

import torch

from ..state import SenderState
from ._attention_capture import capture
from ._common import check_sender, keep_best_spans, request_scores
from ._support import SupportFold, pool7

NAME = "QSnap"


def qsnap_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw scores, float32 `[T]`: `pool7(votes_mean)`."""
    check_sender(sender)
    return request_scores(sender, request_ids, NAME, _scores)


def _scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    fold = SupportFold(moments=False)
    with torch.inference_mode():
        capture(sender.model, sender.past_key_values, fold, sender.positions, input_ids=request_ids)
        return pool7(fold.votes_mean())


def qsnap(
    sender: SenderState, request_ids: torch.Tensor, budget: int, *, span_size: int = 16, span: str = "fixed"
) -> list[int]:
    """Keep `budget` positions ranked by pooled mean request attention, in whole spans
    (`span` as in `cacheback`)."""
    return keep_best_spans(
        sender,
        budget,
        span=span,
        span_size=span_size,
        name=NAME,
        scores=lambda spans: request_scores(sender, request_ids, NAME, _scores),
    )
