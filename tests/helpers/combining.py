"""Pieces of work that wait for a model together, made deterministic for tests of the flat
combining (`rclc._flat_combining`: prompt prefills and request captures).

Each job runs in a thread of its own while the test holds the model's only forward slot, and
the next thread starts only once the previous one's piece is queued. So every piece is
waiting, in the jobs' order, before any forward runs, and the first thread to get the slot
serves them together, whatever the machine's speed or load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import rclc
# private on purpose: the forward slots the test holds so that the pieces queue together
from rclc._locks import forward_slot


def wait_for(condition: Callable[[], bool], seconds: float = 120.0) -> None:
    """Poll until `condition()`; the threads only need to be scheduled, so the bound is generous."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the pieces never queued")
        threading.Event().wait(0.001)


def queued_together(
    model: Any,
    combiner: Any,
    jobs: Sequence[Callable[[], Any]],
    stops: Sequence[threading.Event | None] | None = None,
) -> list[Any]:
    """Run `jobs` (each queues one piece on `combiner`, the model's `FlatCombiner`) as above;
    `stops[i]` is job i's worker stop flag (a cancelled caller). Returns each job's result or
    the exception it raised."""
    from rclc import _worker  # private on purpose: a worker call's stop flag, set per thread

    results: list[Any] = [None] * len(jobs)
    flags = list(stops) if stops is not None else [None] * len(jobs)

    def one(index: int) -> None:
        _worker._current.stop = flags[index]
        try:
            results[index] = jobs[index]()
        except Exception as error:
            results[index] = error

    before = rclc.configure_batching(model)
    rclc.configure_batching(model, worker_forwards=1)
    try:
        with forward_slot(model):
            threads = []
            for index in range(len(jobs)):
                threads.append(threading.Thread(target=one, args=(index,)))
                threads[-1].start()
                wait_for(lambda: len(combiner._pending) == index + 1)
        for thread in threads:
            thread.join()
    finally:
        rclc.configure_batching(model, before)
    return results
