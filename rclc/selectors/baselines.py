"""Baseline selectors for experiments. They are custom selectors as far as budgets go
(no protected positions are reserved for them)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._arguments import require_int
from ..state import SenderState


def recent(sender: SenderState, request_ids: torch.Tensor, budget: int) -> list[int]:
    """The last `budget` positions (a recency window; position 0 is not special)."""
    require_int("budget", budget, minimum=1)
    total = sender.positions
    return list(range(max(total - budget, 0), total))


def random_selector(seed: int) -> Callable[[SenderState, torch.Tensor, int], list[int]]:
    """A selector keeping position 0 plus `budget - 1` uniformly sampled other positions.

    Every call draws from a fresh generator seeded with `seed`, so the same state and budget
    always give the same selection, whatever was selected before.
    """
    require_int("seed", seed, minimum=0)

    def random_positions(sender: SenderState, request_ids: torch.Tensor, budget: int) -> list[int]:
        require_int("budget", budget, minimum=1)
        total = sender.positions
        if budget >= total:
            return list(range(total))
        generator = torch.Generator().manual_seed(seed)
        others = (torch.randperm(total - 1, generator=generator)[: budget - 1] + 1).tolist()
        return sorted([0, *others])

    random_positions.__name__ = f"random_seed{seed}"
    random_positions.__qualname__ = random_positions.__name__
    return random_positions
