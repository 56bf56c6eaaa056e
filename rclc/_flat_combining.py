"""Work that waits for a model together, served in one forward by whoever gets a slot first
(or, where two forwards at once each get cores of their own, shared between the slot holders).

Why: on a CPU a short forward costs mostly the reading of the weights, so several small
pieces of work (prompts to prefill, requests to capture) in one forward cost little more
than one of them, and pieces asked for by concurrent callers arrive within milliseconds.
Flat combining needs no extra thread: a caller queues its piece and takes one of the
model's forward slots (`rclc._locks`); the caller that holds a slot first serves every
piece waiting at that moment (but see below), and the others find theirs done when they
get a slot in turn.
No library offers this over our per-model slots, so it is written here, once, for both
`rclc._shared_prefill` (prompts) and `rclc.selectors._shared_capture` (request captures).

Combining replaces waiting, not parallelism: a piece whose caller holds a slot of its own
at that moment is left to it when the two forwards would each run on cores of their own (a
CPU model whose intra-op threads fit twice in the process's cores, `parallel_forwards`).
Then each slot holder serves its own piece and an even share of the pieces waiting for a
slot, and the forwards run side by side. A CPU forward of a reader's prompt is
compute-bound, so one forward of three prompts took as long as three on one core while the
other core idled: a fan-out's three readers alone, at one torch thread, prefilled in 0.68 s
in one forward, and in 0.48 s as one forward of two beside one of one (docs/performance.md). With more threads per forward than that, or on an
accelerator, the first slot holder serves every waiting piece, as before.

A failing combined forward is retried one piece at a time, so one caller's bad input never
fails another's; a piece whose caller was cancelled before its turn gets `WorkCancelled`
and costs nothing. The slot holder serves the others even when its own caller was
cancelled meanwhile (they wait on it).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from ._locks import forward_slot, forward_width
from ._worker import WorkCancelled, current_stop, serving_others

GATHER_SECONDS = 0.003
"""How long a slot holder waits for more pieces before it serves fewer than its limit:
pieces asked for together (a fan-out's readers, concurrent runs' transfers) arrive within a
few milliseconds, and the wait is ~2% of a short forward of the embedded model."""


@dataclass(eq=False)  # compared by identity
class Piece:
    """One caller's work; subclasses add what it is. `cancel` is the caller's stop flag."""

    cancel: threading.Event | None = field(default_factory=current_stop, kw_only=True)
    done: threading.Event = field(default_factory=threading.Event, kw_only=True)
    result: Any = field(default=None, kw_only=True)
    error: BaseException | None = field(default=None, kw_only=True)

    def finish(self, result: Any, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


P = TypeVar("P", bound=Piece)


class FlatCombiner(Generic[P]):
    """One model's queue of pieces of one kind; subclasses say which pieces share a forward
    (`fits`) and how a batch is computed (`compute`)."""

    cancelled_message = "the caller was cancelled before its work ran"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._pending: list[P] = []
        self._holders: list[P] = []  # the pieces of callers gathering under a slot of their own

    def fits(self, batch: list[P], other: P) -> bool:
        """Whether `other` may join `batch` (which holds at least the slot holder's own piece)."""
        return True

    def compute(self, model: Any, batch: list[P]) -> list[Any]:
        """Every piece's result, from one forward; raises to have each retried alone."""
        raise NotImplementedError

    def submit(self, model: Any, piece: P, limit: int) -> Any:
        """Queue `piece`, serve a batch of at most `limit` pieces if this caller gets a slot
        first, and return the piece's result (or raise its error)."""
        with self._lock:
            self._pending.append(piece)
            self._arrived.notify_all()
        with forward_slot(model):
            batch = self._take(piece, limit, parallel_forwards(model))
            try:
                self._serve(model, batch)
            except BaseException as error:  # never leave a piece that waits on this thread waiting
                for other in batch:
                    if not other.done.is_set():
                        other.finish(None, error)
                raise
        piece.done.wait()
        if piece.error is not None:
            raise piece.error
        return piece.result

    def _take(self, piece: P, limit: int, parallel: bool = False) -> list[P]:
        """The pieces this slot holder serves: its own (unless another holder already did)
        and those waiting with it, oldest first, while `fits` lets them join. With `parallel`,
        the pieces of other slot holders gathering meanwhile are theirs to serve, and of the
        pieces waiting for a slot this holder takes its share (module docs)."""
        with self._lock:
            self._holders.append(piece)
            try:
                deadline = time.monotonic() + GATHER_SECONDS
                while piece in self._pending and len(self._pending) < limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._arrived.wait(remaining)
                if piece not in self._pending:  # another slot holder took it: its result is on the way
                    return []
                others = [other for other in self._pending if other is not piece]
                share = limit - 1
                if parallel:
                    others = [other for other in others if other not in self._holders]
                    share = min(share, math.ceil(len(others) / len(self._holders)))
                batch = [piece]
                for other in others:
                    if len(batch) > share:
                        break
                    if self.fits(batch, other):
                        batch.append(other)
                self._pending = [other for other in self._pending if other not in batch]
                return batch
            finally:
                self._holders.remove(piece)

    def _serve(self, model: Any, batch: list[P]) -> None:
        live = [piece for piece in batch if not piece.cancelled()]  # (empty batch: nothing)
        for piece in batch:
            if piece not in live:
                piece.finish(None, WorkCancelled(self.cancelled_message))
        if not live:
            return
        with serving_others():
            try:
                outcomes = self.compute(model, live)
            except Exception as error:
                if len(live) == 1:
                    live[0].finish(None, error)
                    return
                outcomes = []
                for piece in live:  # another piece's trouble must not fail this one
                    try:
                        outcomes.append(self.compute(model, [piece])[0])
                    except Exception as alone:
                        outcomes.append(alone)
        for piece, outcome in zip(live, outcomes):
            if isinstance(outcome, Exception):
                piece.finish(None, outcome)
            elif piece.cancelled():
                piece.finish(None, WorkCancelled(self.cancelled_message))
            else:
                piece.finish(outcome)


def parallel_forwards(model: Any) -> bool:
    """Whether two forwards of `model` at once would each run on cores of their own: a CPU
    model whose torch intra-op threads fit twice in the cores this process may use. Then
    a slot holder leaves other slot holders' pieces to them (module docs); otherwise the
    forwards would share cores, and one combined forward reads the weights once."""
    if forward_width(model) < 2:
        return False
    embeddings = getattr(model, "get_input_embeddings", None)
    weight = getattr(embeddings() if callable(embeddings) else None, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.device.type != "cpu":
        return False
    return 2 * torch.get_num_threads() <= usable_cores()


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS reports one: Linux; else
    every core: macOS and Windows have no `os.sched_getaffinity`)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1
