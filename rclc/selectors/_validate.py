"""Checks on what a selector returned, before anything is gathered or delivered.

The selector contract is the design spec's (shared/design/rclc_spec.md#2-selector-contract).
Custom selectors are user code, so their output is checked as strictly as user input:
each violation is a SelectorError that names the selector and what to return instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._arguments import is_exact_int
from ..errors import SelectorError
from ..state import rows_match_ids


def validate_positions(
    positions: Any, budget: int, total: int, selector_name: str, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Return the selected positions as an ascending int64 tensor on `device` (the sender
    rows' device), or raise SelectorError: 1-D int32/int64 tensor or a sequence of exact ints,
    `1 <= count <= budget`, every index in `[0, total)`, no duplicates.
    """
    who = f"selector {selector_name}"
    if isinstance(positions, torch.Tensor):
        if positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
            raise SelectorError(
                f"{who}: returned a {positions.dtype} tensor of shape {tuple(positions.shape)}; "
                "return a 1-D int32/int64 tensor or a sequence of ints"
            )
        indices = positions.detach().to(dtype=torch.int64)
    elif isinstance(positions, Sequence) and not isinstance(positions, (str, bytes)):
        for value in positions:
            if not is_exact_int(value):
                raise SelectorError(f"{who}: returned a non-int element {value!r}; positions must be Python ints")
        indices = torch.tensor(list(positions), dtype=torch.int64)
    else:
        raise SelectorError(
            f"{who}: returned {type(positions).__name__}; return a sequence of ints or a 1-D integer tensor"
        )
    count = int(indices.shape[0])
    if not 1 <= count <= budget:
        raise SelectorError(f"{who}: returned {count} positions; it must return between 1 and {budget} (the budget)")
    indices = indices.to(device=device if device is not None else indices.device)
    indices = torch.sort(indices).values
    low, high = int(indices[0]), int(indices[-1])
    if low < 0 or high >= total:
        raise SelectorError(f"{who}: returned position {low if low < 0 else high}, outside 0..{total - 1}")
    if count > 1 and bool((indices[1:] == indices[:-1]).any()):
        raise SelectorError(f"{who}: returned duplicate positions; each position may be selected once")
    return indices


def gather_rows(
    rows: torch.Tensor, token_ids: torch.Tensor | None, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Selected rows and token IDs in ascending source order (indices from `validate_positions`)."""
    picked_rows = rows.index_select(0, indices)
    picked_ids = None if token_ids is None else token_ids.index_select(0, indices.to(token_ids.device))
    return picked_rows, picked_ids


def check_ids_reproduce_rows(
    rows: torch.Tensor, token_ids: torch.Tensor, weight: torch.Tensor, selector_name: str
) -> None:
    """For `token_ids+continuous`: every selected row with an ID >= 0 must equal that ID's
    embedding row bit for bit, else the receiver would rebuild different rows."""
    if not rows_match_ids(rows, token_ids, weight):
        raise SelectorError(
            f"selector {selector_name}: the token IDs of the selected positions do not reproduce their rows; "
            "use representation 'continuous' for states whose rows are not plain embeddings"
        )
