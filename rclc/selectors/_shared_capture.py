"""Request captures that wait for a model together, folded in one forward.

Why: a capture forwards a request of a few rows over a sender's cache, so it costs about
what a decode step does (the whole model's weights are read for a handful of rows). A
fan-in's senders are already captured in one forward (`capture_each`), but concurrent runs
each ran their own: in 32 concurrent fanout_qa runs the answerers' captures took 16% of the
process's CPU (docs/performance.md). Captures of concurrent runs arrive together (their
transfers reach the model at about the same time and queue for its forward slots), so one
forward can serve several transfers' captures for little more than one costs.

How: flat combining (`rclc._flat_combining`, as for prompts; no extra thread). A
transfer's capture queues its senders, then takes one of the model's forward slots. Whoever
holds a slot first waits a few milliseconds for more transfers (while fewer than
`capture_batch` wait), then folds every waiting transfer's senders in one `capture_each`
forward (its share of them, when another slot holder gathers meanwhile and their forwards
each get cores of their own); the others find their folds done when they get a slot in turn.

Exactness: `capture_each` batches only the projections and MLPs; attention runs per sender
over its own memory, so each fold sees what a capture alone sees up to a BLAS that rounds a
row differently at another batch size (none measured on the development CPU:
benchmarks/fan_in_capture.py). `capture_batch=1` (`rclc.Batching`) runs each transfer's
captures in their own forward, as before.

Failure and cancellation (`FlatCombiner`): a combined forward that fails is retried one
transfer at a time, each with fresh folds, so one transfer's bad input never fails
another's; a transfer whose caller was cancelled before its turn gets `WorkCancelled`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._flat_combining import FlatCombiner, Piece
from .._per_object import PerObject
from ..policy import DEFAULT_CAPTURE_BATCH
from ._attention_capture import capture_each

BATCHED_ROWS = 512
"""A combined forward stops growing once its request rows (every sender's, packed) would
pass this many: beyond it a forward is compute-bound on a CPU, and batching saves nothing.
A transfer's own senders are always captured together."""

Target = tuple[Any, int, torch.Tensor]
"""One sender to capture: `(past, memory, input_ids [1, rows])`."""


@dataclass(eq=False)  # compared by identity
class _Transfer(Piece):
    targets: list[Target]
    new_fold: Callable[[], Any]

    @property
    def rows(self) -> int:
        return sum(int(ids.shape[1]) for _, _, ids in self.targets)


@dataclass
class _Statistics:
    transfers: int = 0
    senders: int = 0
    forwards: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)  # transfers per forward -> forwards


class SharedCapture(FlatCombiner[_Transfer]):
    """One model's request captures (see the module docs)."""

    cancelled_message = "the caller was cancelled before its capture ran"

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.capture_batch = DEFAULT_CAPTURE_BATCH
        self.stats = _Statistics()

    def configure(self, capture_batch: int) -> None:
        """Fold up to `capture_batch` transfers' captures in one forward (1: each alone)."""
        with self._lock:
            self.capture_batch = capture_batch

    def folds(self, model: Any, targets: Sequence[Target], new_fold: Callable[[], Any]) -> list[Any]:
        """A fold per target (made by `new_fold`), each folded as `capture` of it alone would."""
        transfer = _Transfer(list(targets), new_fold)
        if self.capture_batch == 1:
            return self.compute(model, [transfer])[0]
        return self.submit(model, transfer, self.capture_batch)

    def fits(self, batch: list[_Transfer], other: _Transfer) -> bool:
        """Whether the forward's request rows stay within `BATCHED_ROWS` with `other`."""
        return sum(transfer.rows for transfer in batch) + other.rows <= BATCHED_ROWS

    def compute(self, model: Any, batch: list[_Transfer]) -> list[list[Any]]:
        """Every transfer's folds, fresh, from one `capture_each` forward over all their senders."""
        folds = [[transfer.new_fold() for _ in transfer.targets] for transfer in batch]
        items = [
            (past, memory, ids, fold)
            for transfer, transfer_folds in zip(batch, folds)
            for (past, memory, ids), fold in zip(transfer.targets, transfer_folds)
        ]
        with torch.inference_mode():
            capture_each(model, items)
        with self._lock:
            stats = self.stats
            stats.transfers += len(batch)
            stats.senders += len(items)
            stats.forwards += 1
            stats.batch_sizes[len(batch)] = stats.batch_sizes.get(len(batch), 0) + 1
        return folds

    def report(self) -> dict[str, Any]:
        """Options and figures (`rclc.batching_report`'s `request_captures`)."""
        with self._lock:
            stats = self.stats
            return {
                "capture_batch": self.capture_batch,
                "transfers": stats.transfers,
                "senders": stats.senders,
                "forwards": stats.forwards,
                "batch_sizes": {str(size): count for size, count in sorted(stats.batch_sizes.items())},
            }


_captures: PerObject[SharedCapture] = PerObject(SharedCapture)


def shared_capture(model: Any) -> SharedCapture:
    """The request captures of `model` (made on first use)."""
    return _captures.get(model)


def existing_shared_capture(model: Any) -> SharedCapture | None:
    return _captures.existing(model)
