"""QSnap: mean request attention per position, pooled (CacheBack without the support correction)."""

from __future__ import annotations

import torch

from ..state import SenderState
from ._common import check_sender, request_scores, request_selector
from ._support import pool7, request_fold

NAME = "QSnap"


def _scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    return pool7(request_fold(sender, request_ids, moments=False).votes_mean())


qsnap, qsnap_profile = request_selector(
    "qsnap", NAME, _scores, "Keep `budget` positions ranked by pooled mean request attention, in whole spans.", __name__,
)


def qsnap_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw scores, float32 `[T]`: `pool7(votes_mean)`."""
    check_sender(sender)
    return request_scores(sender, request_ids, NAME, _scores)
