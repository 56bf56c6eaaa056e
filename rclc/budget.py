"""Position budgets: how many sender positions a handoff may keep, and fitting them into receivers.

Pure integer arithmetic, kept apart from tensors so it can be property-tested directly.

Relative rX keeps `I + ceil((L - I) / r)`: inherited rows stay affordable and new rows are
compressed r-fold, so chain memory grows by one compressed chunk per hop. Bounded B keeps
`min(B, L)`, so chain memory stops growing once the cap binds. `L = T + reserve`, where
`reserve` are rows reserved for post-selection reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import require_int

DEFAULT_RATIO = 4


@dataclass(frozen=True)
class BudgetPolicy:
    """Either relative (`ratio`) or bounded (`budget`), never both."""

    ratio: int | None = None
    budget: int | None = None

    @classmethod
    def from_options(cls, ratio: object = None, budget: object = None) -> BudgetPolicy:
        if ratio is not None and budget is not None:
            raise ValueError("ratio, budget: pass one of them, not both (ratio is relative rX, budget is bounded)")
        if budget is not None:
            return cls(budget=require_int("budget", budget, minimum=1))
        if ratio is not None:
            return cls(ratio=require_int("ratio", ratio, minimum=1))
        return cls(ratio=DEFAULT_RATIO)

    @property
    def label(self) -> str:
        return f"r{self.ratio}" if self.ratio is not None else f"b{self.budget}"

    def cap(self, total: int, inherited: int = 0, reserve: int = 0) -> int:
        """Positions transmitted for a sender of `total` rows, `inherited` of them carried."""
        length = total + reserve
        if self.budget is not None:
            return min(self.budget, length)
        ratio = self.ratio if self.ratio is not None else DEFAULT_RATIO
        return inherited + (length - inherited + ratio - 1) // ratio


def floor(*, builtin: bool, latent_steps: int, reserve: int) -> int:
    """The least a cap may be: built-ins must keep position 0 and the latent tail."""
    return latent_steps + reserve + 1 if builtin else reserve + 1


def check_caps(caps: list[int], floors: list[int]) -> None:
    for index, (cap, least) in enumerate(zip(caps, floors)):
        if cap < least:
            raise ValueError(
                f"budget: sender {index} may send {cap} positions but needs at least {least} "
                "(its first position, latent tail and reserved reasoning rows); raise budget or lower ratio"
            )


def fit(caps: list[int], floors: list[int], available: int | None) -> list[int]:
    """Share `available` receiver positions among senders without exceeding any cap.

    If every cap fits, caps stand. Otherwise each sender starts at its floor and the rest
    is water-filled in equal shares; what short senders cannot use goes to the others and
    the last few positions go one each to the earliest senders.
    """
    check_caps(caps, floors)
    total = sum(caps)
    if available is None or total <= available:
        return list(caps)
    counts = list(floors)
    if sum(counts) > available:
        raise ValueError(
            f"receiver: it has {max(available, 0)} handoff positions but the senders need at least {sum(counts)}; "
            "shorten its history, reserve fewer output tokens, use fewer senders or less reasoning"
        )
    remaining = available - sum(counts)
    active = [i for i, (count, cap) in enumerate(zip(counts, caps)) if count < cap]
    while remaining > 0 and active:
        share = max(1, remaining // len(active))
        for index in active:
            grant = min(share, caps[index] - counts[index], remaining)
            counts[index] += grant
            remaining -= grant
        active = [i for i in active if counts[i] < caps[i]]
    return counts
