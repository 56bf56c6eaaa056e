"""CacheBack: receiver-conditioned selection by request attention with a support correction.

The request is forwarded over a private view of the sender's cache; positions the request
attends to score high (QSnap's votes), boosted where a few request rows concentrate their
attention rather than spreading it (the squared support correction). The keep step then
keeps whole spans (shared/design/rclc_spec.md#44-keep-step-keep_spans--fixed_span_keep):
the fixed grid, or the sender's sentences, paragraphs or lines (`span`, at most `max_span`
positions each), passing over the positions `exclude` marks (rclc.exclusion).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..state import SenderState
from ._common import SpanProfile, check_sender, request_profile, request_scores, select_by_request
from ._support import composite_score, request_fold

NAME = "CacheBack"


def cacheback(
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
    """Keep `budget` positions of `sender` that `request_ids` needs most, as ascending indices.

    Always keeps position 0 and the latent tail; `span_size`, `span` and `max_span` change
    granularity only. `span="fixed"` keeps spans of the `span_size` grid; `"sentence"`,
    `"paragraph"` and `"line"` keep whole units of the sender's text (they need the sender's
    tokenizer and token IDs); `max_span` splits longer spans. `exclude` (one entry per
    position, None or the reason) ranks the excluded positions after all others.
    `span_starts` (positions where a run of rows begins, e.g. a chain's inherited runs) also
    cut the text-aligned spans; the fixed grid ignores them.
    Returns every position, without any model work, when `budget >= T`.
    """
    return select_by_request(
        sender, request_ids, budget, span=span, span_size=span_size, max_span=max_span, exclude=exclude,
        span_starts=span_starts, name=NAME,
        score=_scores,
    )


def cacheback_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw composite scores, float32 `[T]`: `pool7(votes) * ratio ** 2`."""
    check_sender(sender)
    return request_scores(sender, request_ids, NAME, _scores)


def _scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    return composite_score(request_fold(sender, request_ids, moments=True))


def cacheback_profile(
    sender: SenderState,
    request_ids: torch.Tensor,
    *,
    span_size: int = 16,
    span: str = "fixed",
    max_span: int | None = None,
    exclude: Sequence[str | None] | None = None,
    span_starts: Sequence[int] | None = None,
) -> SpanProfile:
    """Scores, spans and exclusions of `cacheback` for one sender (what pooled allocation ranks)."""
    return request_profile(
        sender, request_ids, span=span, span_size=span_size, max_span=max_span, exclude=exclude,
        span_starts=span_starts, name=NAME, score=_scores,
    )
