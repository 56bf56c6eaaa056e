"""Holding a model's forwards until their caller is cancelled, so a test can stop a server or
a run *while* a run is running without racing a clock: with the hold on, a run cannot finish
by itself, however fast or loaded the machine is (issue 24: no test may depend on timing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# private on purpose: the worker thread's cancellation internals under test
from rclc._worker import stop_requested


def caller_cancelled(model: Any) -> bool:
    """Whether the forward running in this thread belongs to a cancelled caller: in a worker
    thread, its stop flag; in the batching engine's thread (no worker of its own), whether a
    sequence it is prefilling or decoding is gone (the engine drops it after this forward)."""
    if stop_requested():
        return True
    from rclc.backends.hf_batching import existing_engine

    engine = existing_engine(model)
    if engine is None:
        return False
    sequences = list(engine._active) + list(engine._prefilling)  # prefilling: a list since issue 28
    return any(sequence.gone() for sequence in sequences)


def wait_for_cancel(model: Any, released: threading.Event | None = None, seconds: float = 60.0) -> None:
    """Block this forward until its caller's cancellation has reached it (`caller_cancelled`)
    or the test sets `released`. Bounded, so a cancellation that never arrives fails the
    test's asserts instead of hanging it."""
    deadline = time.monotonic() + seconds
    while not caller_cancelled(model) and not (released is not None and released.is_set()) \
            and time.monotonic() < deadline:
        time.sleep(0.005)


@contextmanager
def held_forwards(model: Any) -> Iterator[threading.Event]:
    """Inside: while the yielded event is set, every forward of `model` waits until its caller
    is cancelled (then it returns, and the run stops at its next step). Clear the event to let
    forwards run freely again."""
    holding = threading.Event()

    def hold(*_: Any) -> None:
        while holding.is_set() and not caller_cancelled(model):
            threading.Event().wait(0.01)

    handle = model.register_forward_pre_hook(hold)
    try:
        yield holding
    finally:
        handle.remove()


@contextmanager
def held_from_first_token(model: Any) -> Iterator[threading.Event]:
    """`held_forwards`, switched on by the first generated token (of any sequence) once inside:
    a run whose only generating node is its last then cannot finish before its caller is
    cancelled, while everything up to that node's first token runs freely. It switches on once;
    leaving clears it, so a later resume generates freely."""
    from rclc.backends import hf_sequences

    add = hf_sequences.Sequence.add
    with held_forwards(model) as holding:
        armed = [True]

        def adding(sequence: Any, token: int) -> bool:
            if armed[0]:
                armed[0] = False
                holding.set()
            return add(sequence, token)

        hf_sequences.Sequence.add = adding
        try:
            yield holding
        finally:
            hf_sequences.Sequence.add = add
            holding.clear()
