"""QSnap: mean request attention per position, pooled (CacheBack without the support correction)."""

from __future__ import annotations

import torch

from ..state import SenderState
from ._capture import capture
from ._common import check_context, check_finite, check_request_ids, check_sender, selects
from ._sentences import check_span_option, partition
from ._spans import keep_spans
from ._support import SupportFold, pool7

NAME = "QSnap"


def qsnap_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw scores, float32 `[T]`: `pool7(votes_mean)`."""
    check_sender(sender)
    check_request_ids(request_ids)
    check_context(sender, request_ids, NAME)
    return _scores(sender, request_ids)


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
    check_sender(sender)
    check_span_option(sender, span)
    if not selects(sender, budget, span_size):
        return list(range(sender.positions))
    check_request_ids(request_ids)
    check_context(sender, request_ids, NAME)
    scores = _scores(sender, request_ids)
    check_finite(scores, NAME)
    return keep_spans(scores, budget, partition(sender, span, span_size), sender.latent_steps)
