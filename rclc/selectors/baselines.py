"""Baseline selectors for experiments. They are custom selectors as far as budgets go
(no protected positions are reserved for them).

Both take `exclude` like the built-ins (rclc.exclusion): excluded positions are chosen only
once every other position is, so a receiver-aware baseline spends its budget the same way
an attention selector does, and the comparison stays about the scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._arguments import require_int
from ..state import SenderState
from ..user_code import thread_safe
from ._common import check_exclude, excluded_flags


def _excluded_last(candidates: list[int], flags: list[bool] | None) -> list[int]:
    """`candidates` in their order, the excluded ones moved after the others."""
    if flags is None:
        return candidates
    return [p for p in candidates if not flags[p]] + [p for p in candidates if flags[p]]


@thread_safe  # ours, and stateless: runs beside other transfers' selections
def recent(
    sender: SenderState, request_ids: torch.Tensor, budget: int, *, exclude: Sequence[str | None] | None = None
) -> list[int]:
    """The last `budget` positions (a recency window; position 0 is not special); with
    `exclude`, the last `budget` positions that are not excluded (excluded ones only fill up)."""
    require_int("budget", budget, minimum=1)
    total = sender.positions
    flags = excluded_flags(check_exclude(exclude, total))
    if flags is None:
        return list(range(max(total - budget, 0), total))
    newest_first = _excluded_last(list(range(total - 1, -1, -1)), flags)
    return sorted(newest_first[:budget])


def random_selector(seed: int) -> Callable[..., list[int]]:
    """A selector keeping position 0 plus `budget - 1` uniformly sampled other positions.

    Every call draws from a fresh generator seeded with `seed`, so the same state and budget
    always give the same selection, whatever was selected before. With `exclude`, the
    sample is drawn from the positions that are not excluded first.
    """
    require_int("seed", seed, minimum=0)

    def random_positions(
        sender: SenderState, request_ids: torch.Tensor, budget: int, *, exclude: Any = None
    ) -> list[int]:
        require_int("budget", budget, minimum=1)
        total = sender.positions
        flags = excluded_flags(check_exclude(exclude, total))
        if budget >= total:
            return list(range(total))
        generator = torch.Generator().manual_seed(seed)
        drawn = (torch.randperm(total - 1, generator=generator) + 1).tolist()
        return sorted([0, *_excluded_last(drawn, flags)[: budget - 1]])

    random_positions.__name__ = f"random_seed{seed}"
    random_positions.__qualname__ = random_positions.__name__
    return thread_safe(random_positions)  # a fresh generator per call: no shared state
