"""CacheBack: receiver-conditioned selection by request attention with a support correction.

The request is forwarded over a private view of the sender's cache; positions the request
attends to score high (QSnap's votes), boosted where a few request rows concentrate their
attention rather than spreading it (the squared support correction). The keep step then
keeps whole spans (shared/design/rclc_spec.md#44-keep-step-keep_spans--fixed_span_keep):
the fixed grid, or the sender's sentences.
"""

from __future__ import annotations

import torch

from ..state import SenderState
from ._attention_capture import capture
from ._common import check_sender, keep_best_spans, request_scores
from ._support import SupportFold, composite_score

NAME = "CacheBack"


def cacheback_scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    """Raw composite scores, float32 `[T]`: `pool7(votes) * ratio ** 2`."""
    check_sender(sender)
    return request_scores(sender, request_ids, NAME, _scores)


def _scores(sender: SenderState, request_ids: torch.Tensor) -> torch.Tensor:
    fold = SupportFold(moments=True)
    with torch.inference_mode():
        capture(sender.model, sender.past_key_values, fold, sender.positions, input_ids=request_ids)
        return composite_score(fold)


def cacheback(
    sender: SenderState, request_ids: torch.Tensor, budget: int, *, span_size: int = 16, span: str = "fixed"
) -> list[int]:
    """Keep `budget` positions of `sender` that `request_ids` needs most, as ascending indices.

    Always keeps position 0 and the latent tail; `span_size` and `span` change granularity
    only. `span="fixed"` keeps spans of the `span_size` grid; `span="sentence"` keeps whole
    sentences of the sender's text (it needs the sender's tokenizer and token IDs).
    Returns every position, without any model work, when `budget >= T`.
    """
    return keep_best_spans(
        sender,
        budget,
        span=span,
        span_size=span_size,
        name=NAME,
        scores=lambda spans: request_scores(sender, request_ids, NAME, _scores),
    )
