"""The transfer core's locks: one process-wide preparation lock, and forward slots per model.

`preparation_lock` guards what must be read and switched consistently: an agent's state (its
history cache, its pending continuation), a transfer's snapshot of its senders and plan of
its receivers. It is held for bookkeeping, not for model work: the prefill of an explicit
prompt, a selector's scoring and a refresh after generation run outside it (they read only
values they own; agents commit their new state under the lock afterwards). Held across
those forwards, it made every run's prefills and selections one queue: 32 concurrent
fanout_qa runs reached 1.68x the sequential runs/minute with it, 1.69x without it but with
one forward slot, 2.11x without it and with two (one repeat each, docs/performance.md). It
is re-entrant so a helper that already holds it may call another helper that takes it.

Forwards that rclc runs in worker threads (prefills, captures, latent rollouts, re-prefills)
take a `forward_slot` of their model: at most `Batching.worker_forwards` such forwards per
model at a time (default 2), so N concurrent runs do not start N prefills at once on one
model (each would hold its own activations, and on a CPU they would only share the same
cores). The slots are per model, not per process: work on another model never waits for
them. Native generation does not take one: the batching engine (`rclc.backends.hf_batching`)
owns decoding, so a selection never holds up another run's decode. Attention capture needs
no lock at all: it is per thread (see `rclc.selectors._attention_capture`).

A thread holds at most one slot: a forward inside another forward (a capture whose fold
captures another model) runs under the slot already held, so two threads can never wait
for each other's slots. Order is always preparation -> slot, never the reverse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._per_object import PerObject
from .policy import DEFAULT_WORKER_FORWARDS

preparation_lock = threading.RLock()


class _Slots(threading.BoundedSemaphore):
    """A model's forward slots, remembering how many there are and how many are held."""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.width = width
        self.held = 0  # changed under `_counting`: read without it only as a hint (`spare_slot`)

    def take(self, blocking: bool = True) -> bool:
        if not self.acquire(blocking):
            return False
        with _counting:
            self.held += 1
        return True

    def give(self) -> None:
        with _counting:
            self.held -= 1
        self.release()


_counting = threading.Lock()


_slots: PerObject[Any] = PerObject(lambda model: _Slots(DEFAULT_WORKER_FORWARDS))
_held = threading.local()  # .depth: how many forward_slot blocks this thread is inside


def set_forward_width(model: Any, width: int) -> None:
    """Let `width` worker-side forwards run on `model` at once (`Batching.worker_forwards`).

    Forwards under way keep the slots they took (each releases the semaphore it acquired);
    new ones take the new width's. An unchanged width keeps the slots as they are."""
    current = _slots.existing(model)
    if isinstance(current, _Slots) and current.width == width:
        return
    _slots.set(model, _Slots(width))


def forward_width(model: Any) -> int:
    """How many worker-side forwards `model` may run at once (1 when it shares another lock).
    Asking makes no slots (reports ask about models that never forwarded, or stand-ins)."""
    slots = _slots.existing(model)
    if slots is None:
        return DEFAULT_WORKER_FORWARDS  # what its first forward will find
    return slots.width if isinstance(slots, _Slots) else 1


def share_forward_slot(model: Any, lock: Any) -> None:
    """Make `model`'s forwards take `lock` (the vLLM view shares its engine's step lock)."""
    _slots.set(model, lock)


@contextmanager
def forward_slot(model: Any) -> Iterator[None]:
    """Hold `model`'s forward slot for one worker-side forward (re-entrant within a thread)."""
    depth = getattr(_held, "depth", 0)
    if depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    slots = _slots.get(model)
    counted = isinstance(slots, _Slots)  # else another engine's lock (`share_forward_slot`)
    if counted:
        slots.take()
    else:
        slots.acquire()
    _held.depth = 1
    try:
        yield
    finally:
        _held.depth = 0
        if counted:
            slots.give()
        else:
            slots.release()


@contextmanager
def spare_slot(model: Any) -> Iterator[bool]:
    """A forward slot of `model`, taken only when no worker-side forward holds one: True
    inside the block when it was taken (the batching engine then runs a second forward of
    its own beside the one it runs anyway, on a core no worker forward uses), False when
    worker forwards are under way or the slots are another engine's lock (never waits)."""
    slots = _slots.get(model)
    if not isinstance(slots, _Slots) or slots.held or getattr(_held, "depth", 0) or not slots.take(blocking=False):
        yield False
        return
    try:
        yield True
    finally:
        slots.give()
