"""CacheBack: receiver-conditioned selection by request attention with a support correction.

The request is forwarded over a private view of the sender's cache; positions the request
attends to score high (QSnap's votes), boosted where a few request rows concentrate their
attention rather than spreading it (the squared support correction). The keep step then
keeps whole spans (shared/design/rclc_spec.md#44-keep-step-keep_spans--fixed_span_keep):
the fixed grid, or the sender's sentences, paragraphs or lines (`span`, at most `max_span`
positions each), passing over the positions `exclude` marks (rclc.exclusion).
"""

from __future__ import annotations

import torch

from ..state import SenderState
from ._common import check_sender, request_scores, request_selector
from ._support import composite_score, request_fold

NAME = "CacheBack"


def _scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    return composite_score(request_fold(sender, request_ids, moments=True))


cacheback, cacheback_profile = request_selector(
    "cacheback", NAME, _scores, "Keep `budget` positions of `sender` that `request_ids` needs most, as ascending indices.",
    __name__,
)


def cacheback_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw composite scores, float32 `[T]`: `pool7(votes) * ratio ** 2`."""
    check_sender(sender)
    return request_scores(sender, request_ids, NAME, _scores)
