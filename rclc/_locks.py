"""The transfer core's locks: one process-wide preparation lock, and a forward slot per model.

Selection and sender snapshots hold `preparation_lock`, so concurrent transfers never run
two selectors at once and an agent's state is read and switched consistently. It is
re-entrant so a helper that already holds it may call another helper that takes it.

Forwards that rclc runs in worker threads (prefills, captures, latent rollouts, re-prefills)
take the `forward_slot` of their model: one such forward per model at a time, so N
concurrent runs do not start N prefills at once on one model (each would hold its own
activations, and on a CPU they would only share the same cores). The slot is per model,
not per process: work on another model never waits for it. Native generation does not take
it: the batching engine (`rclc.backends.hf_batching`) owns decoding, so a selection never
holds up another run's decode. Attention capture needs no lock at all any more: it is
per thread (see `rclc.selectors._attention_capture`).

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

preparation_lock = threading.RLock()

_slots: PerObject[Any] = PerObject(lambda model: threading.Lock())
_held = threading.local()  # .depth: how many forward_slot blocks this thread is inside


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
    with _slots.get(model):
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
