"""What every built-in selector shares: argument checks, guards and the check-score-keep step.

The contracts are the design spec's (shared/design/rclc_spec.md#41-public-shape,
#5-qsnap-selector-mean-query-attention-cacheback-without-correction and
#6-chunkkv-selector-request-agnostic-baseline); docs/api.md#budgets-and-chains says what users see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._arguments import is_exact_int, require_int
from ..errors import ContextLimitError, RclcError
from ..models import context_limit_of
from ..state import SenderState
from ._sentences import check_span_option, partition
from ._spans import Span, keep_spans


def check_sender(sender: Any) -> SenderState:
    if not isinstance(sender, SenderState):
        raise RclcError(f"sender: expected a SenderState, got {type(sender).__name__}")
    sender.validate()
    return sender


def check_request_ids(request_ids: Any) -> torch.Tensor:
    if (
        not isinstance(request_ids, torch.Tensor)
        or request_ids.dtype != torch.int64
        or request_ids.dim() != 2
        or request_ids.shape[0] != 1
        or request_ids.shape[1] < 1
    ):
        described = (
            f"{request_ids.dtype} {tuple(request_ids.shape)}"
            if isinstance(request_ids, torch.Tensor)
            else type(request_ids).__name__
        )
        raise RclcError(f"request_ids: expected a non-empty int64 tensor shaped [1, n], got {described}")
    return request_ids


def check_span_size(span_size: Any, span_field: str = "span_size") -> int:
    """`span_field` names the option as the caller spelled it (ChunkKV calls it chunk_size)."""
    if not is_exact_int(span_size) or span_size < 1:
        alias = "" if span_field == "span_size" else " (the span_size of the keep step)"
        raise RclcError(f"{span_field}: expected an int >= 1{alias}, got {span_size!r}")
    return span_size


def selects(sender: SenderState, budget: Any, span_size: Any, *, span_field: str = "span_size") -> bool:
    """Validate the span size and budget; False when the budget already covers every row."""
    check_span_size(span_size, span_field)
    require_int("budget", budget, minimum=1)
    if budget < sender.latent_steps + 1:
        raise RclcError(
            f"budget: {budget} cannot cover the first position and the {sender.latent_steps}-row latent tail; "
            f"it must be at least {sender.latent_steps + 1}"
        )
    return budget < sender.positions


def check_context(sender: SenderState, request_ids: torch.Tensor, selector_name: str) -> None:
    limit = context_limit_of(sender.model)
    needed = sender.positions + int(request_ids.shape[1])
    if needed > limit:
        raise ContextLimitError(
            f"{selector_name}: the sender state ({sender.positions} positions) plus the request "
            f"({request_ids.shape[1]} tokens) exceeds the model's context limit of {limit}; "
            "shorten the request or the sender state"
        )


def check_finite(scores: torch.Tensor, selector_name: str) -> None:
    if not bool(torch.isfinite(scores).all()):
        raise RuntimeError(
            f"{selector_name}: scores contain NaN or infinity (the model produced non-finite attention); "
            "check the sender's cache and the model's dtype"
        )


def request_scores(
    sender: SenderState, request_ids: Any, name: str, score: Callable[[SenderState, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """`score(sender, request_ids)` once the request is valid and fits after the sender's state."""
    check_request_ids(request_ids)
    check_context(sender, request_ids, name)
    return score(sender, request_ids)


def select_by_request(
    sender: Any,
    request_ids: Any,
    budget: Any,
    *,
    span: Any,
    span_size: Any,
    name: str,
    score: Callable[[SenderState, torch.Tensor], torch.Tensor],
) -> list[int]:
    """`keep_best_spans` over scores of the request's attention (CacheBack and QSnap)."""
    return keep_best_spans(
        sender,
        budget,
        span=span,
        span_size=span_size,
        name=name,
        scores=lambda spans: request_scores(sender, request_ids, name, score),
    )


def keep_best_spans(
    sender: Any,
    budget: Any,
    *,
    span: Any,
    span_size: Any,
    name: str,
    scores: Callable[[list[Span]], torch.Tensor],
    span_field: str = "span_size",
) -> list[int]:
    """The check-score-keep step of every built-in selector, as ascending kept positions.

    Checks the sender, the span option and the budget before any model work; returns
    every position when the budget already covers the state; otherwise asks
    `scores(spans)` for one score per position (the selector's own model work, which
    checks its own inputs first), refuses non-finite scores and keeps whole spans of the
    partition in descending score order (`keep_spans`), first position and latent tail
    always included.
    """
    check_sender(sender)
    check_span_option(sender, span)
    if not selects(sender, budget, span_size, span_field=span_field):
        return list(range(sender.positions))
    spans = partition(sender, span, span_size)
    scored = scores(spans)
    check_finite(scored, name)
    return keep_spans(scored, budget, spans, sender.latent_steps)
