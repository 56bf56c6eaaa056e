"""ChunkKV: a request-agnostic baseline. The sender's own last `window_size` rows play the
request; prefix positions are scored by the window's attention, smoothed, averaged per
chunk, and the window itself always outranks the prefix
(shared/design/rclc_spec.md#6-chunkkv-selector-request-agnostic-baseline). With
`span="sentence"` (or paragraph, line) the chunks are the sender's own text units instead of
the `chunk_size` grid; `max_span` and `exclude` work as in `cacheback`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .._arguments import is_exact_int
from ..errors import CaptureError, RclcError
from ..state import SenderState
from ._attention_capture import capture
from ._common import SpanOptions, SpanProfile, check_sender, check_span_size, keep_best_spans, span_profile
from ._sentences import check_max_span, check_span_option, partition
from ._spans import Span, span_means

NAME = "ChunkKV"


class ChunkKVFold:
    """Per global layer: window attention to the prefix, average-pooled, grouped per KV head,
    with every window position scored `max + 1`; summed over layers."""

    def __init__(self, kernel_size: int) -> None:
        self.kernel_size = kernel_size
        self.layers = 0
        self.total: torch.Tensor | None = None

    def __call__(self, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        _, heads, window, _ = query.shape
        kv_heads, positions = key.shape[1], key.shape[2]
        group = heads // kv_heads
        prefix = positions - window
        keys_t = key[0].float().repeat_interleave(group, dim=0).transpose(-1, -2)  # [H, d, T]
        logits = torch.matmul(query[0].float(), keys_t) * scaling  # [H, window, T]
        hidden = torch.ones(window, window, dtype=torch.bool, device=query.device).triu(1)
        logits[..., prefix:].masked_fill_(hidden, float("-inf"))
        attention = torch.softmax(logits, dim=-1)[..., :prefix].mean(dim=1)  # [H, prefix]
        pooled = F.avg_pool1d(attention, self.kernel_size, 1, self.kernel_size // 2, count_include_pad=True)
        grouped = pooled.unflatten(0, (kv_heads, group)).mean(dim=1)  # [K, prefix]
        window_scores = (grouped.max() + 1.0).expand(kv_heads, window)
        layer = torch.cat([grouped, window_scores], dim=-1).mean(dim=0)  # [T]
        self.total = layer if self.total is None else self.total + layer
        self.layers += 1

    def scores(self) -> torch.Tensor:
        if self.total is None or self.layers == 0:
            raise CaptureError(f"{NAME}: no layer was scored (the capture folded no global layer)")
        return self.total / self.layers


def _check_options(sender: SenderState, chunk_size: object, window_size: object, kernel_size: object) -> int:
    for name, value in (("chunk_size", chunk_size), ("window_size", window_size), ("kernel_size", kernel_size)):
        if not is_exact_int(value):
            raise RclcError(f"{name}: expected an int, got {value!r}")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise RclcError(f"kernel_size: expected an odd int >= 1 (a centred pooling window), got {kernel_size}")
    if window_size < 1:
        raise RclcError(f"window_size: expected an int >= 1, got {window_size}")
    prefix = sender.positions - window_size
    if prefix < 1:
        raise RclcError(
            f"window_size: {window_size} leaves no prefix to score in a {sender.positions}-position state; "
            "use a window shorter than the sender state"
        )
    return prefix


def chunkkv_scores(
    sender: SenderState,
    request_ids: torch.Tensor | None = None,
    *,
    chunk_size: int = 16,
    window_size: int = 32,
    kernel_size: int = 5,
    span: str = "fixed",
    max_span: int | None = None,
) -> torch.Tensor:
    """Per-position scores (each position holds its chunk's mean), float32 `[T]`. The request is ignored."""
    check_sender(sender)
    check_span_option(sender, span)
    check_span_size(chunk_size, "chunk_size")
    check_max_span(max_span)
    prefix = _check_options(sender, chunk_size, window_size, kernel_size)
    return _scores(sender, prefix, partition(sender, span, chunk_size, max_span), kernel_size)


def _scores(sender: SenderState, prefix: int, spans: list[Span], kernel_size: int) -> torch.Tensor:
    fold = ChunkKVFold(kernel_size)
    with torch.inference_mode():
        window_rows = sender.input_embeds[prefix:].unsqueeze(0)
        capture(sender.model, sender.past_key_values, fold, prefix, inputs_embeds=window_rows)
        per_position = fold.scores().float().cpu()
    sizes = torch.tensor([stop - start for start, stop in spans])
    return span_means(per_position, spans).repeat_interleave(sizes)


def _window_scores(sender: SenderState, chunk_size: object, window_size: object, kernel_size: object) -> Any:
    """The selector's model work, once the keep step has checked the span options."""

    def scores(spans: list[Span]) -> torch.Tensor:
        prefix = _check_options(sender, chunk_size, window_size, kernel_size)
        return _scores(sender, prefix, spans, kernel_size)  # type: ignore[arg-type]

    return scores


def chunkkv(  # the selector protocol: one keyword per option a graph may set (rclc.policy.SELECTORS), so 12 parameters
    sender: SenderState,
    request_ids: torch.Tensor,
    budget: int,
    *,
    chunk_size: int = 16,
    window_size: int = 32,
    kernel_size: int = 5,
    span: str = "fixed",
    max_span: int | None = None,
    exclude: Sequence[str | None] | None = None,
    span_starts: Sequence[int] | None = None,
    relevance: float | None = None,
    exclude_by: str = "position",
) -> list[int]:
    """Keep `budget` positions by chunk-averaged attention from the sender's own last window
    (`span="sentence"`: chunks are the sender's sentences; `span`, `max_span`, `exclude`,
    `relevance` and `exclude_by` as in `cacheback`)."""
    options = SpanOptions(span, chunk_size, max_span, exclude, span_starts, size_field="chunk_size", relevance=relevance,
                          exclude_by=exclude_by)
    return keep_best_spans(sender, budget, options,
                           lambda: chunkkv_profile(sender, None, options, window_size=window_size, kernel_size=kernel_size))


def chunkkv_profile(
    sender: SenderState, request_ids: torch.Tensor | None, options: SpanOptions, *, window_size: int = 32,
    kernel_size: int = 5,
) -> SpanProfile:
    """Scores, spans and exclusions of `chunkkv` for one sender (what pooled allocation ranks)."""
    if options.bridge:
        raise RclcError("bridge: ChunkKV scores no request (its window is the sender's own last rows), so there is "
                        "nothing to extend; use cacheback or qsnap, or leave bridge unset")
    return span_profile(sender, options, name=NAME,
                        scores=_window_scores(sender, options.size, window_size, kernel_size))
