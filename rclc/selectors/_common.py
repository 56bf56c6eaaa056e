"""Argument checks and guards shared by the built-in selectors (spec sections 4.1, 5, 6)."""

from __future__ import annotations

from typing import Any

import torch

from .._checks import is_exact_int, require_int
from ..models import context_limit_of
from ..state import SenderState


def check_sender(sender: Any) -> SenderState:
    if not isinstance(sender, SenderState):
        raise ValueError(f"sender: expected a SenderState, got {type(sender).__name__}")
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
        raise ValueError(f"request_ids: expected a non-empty int64 tensor shaped [1, n], got {described}")
    return request_ids


def check_span_size(span_size: Any, span_field: str = "span_size") -> int:
    """`span_field` names the option as the caller spelled it (ChunkKV calls it chunk_size)."""
    if not is_exact_int(span_size) or span_size < 1:
        alias = "" if span_field == "span_size" else " (the span_size of the keep step)"
        raise ValueError(f"{span_field}: expected an int >= 1{alias}, got {span_size!r}")
    return span_size


def selects(sender: SenderState, budget: Any, span_size: Any, *, span_field: str = "span_size") -> bool:
    """Validate the span size and budget; False when the budget already covers every row."""
    check_span_size(span_size, span_field)
    require_int("budget", budget, minimum=1)
    if budget < sender.latent_steps + 1:
        raise ValueError(
            f"budget: {budget} cannot cover the first position and the {sender.latent_steps}-row latent tail; "
            f"it must be at least {sender.latent_steps + 1}"
        )
    return budget < sender.positions


def check_context(sender: SenderState, request_ids: torch.Tensor, selector_name: str) -> None:
    limit = context_limit_of(sender.model)
    needed = sender.positions + int(request_ids.shape[1])
    if needed > limit:
        raise ValueError(
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
