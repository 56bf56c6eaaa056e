"""Run blocking model work in a worker thread with the core's cancellation contract.

`run_in_worker` is public as `rclc.run_in_worker`; the stop flag helpers are the core's own.

A cancelled caller does not abandon the thread: model state (attention dispatch, caches)
is only consistent once the worker has finished and restored it. So the wait is shielded,
and the caller's cancellation is raised only after the worker returns, before anything
the worker produced can be delivered.

Waiting for the thread must not mean waiting for all of its work: a selection or a latent
rollout may run many forwards in one call. So the worker carries a stop flag that is set
the moment its caller is cancelled, and every forward rclc runs (`_cache.forward_rows`)
checks it first and raises `WorkCancelled`. Cancellation therefore ends the work after
the model step that is under way, and the `with` blocks of that step restore what it
changed (attention dispatch, locks) on the way out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

T = TypeVar("T")

_current = threading.local()  # .stop: the threading.Event of the worker call running in this thread


class WorkCancelled(Exception):
    """Raised in a worker thread at its next model step once the awaiting task was cancelled.

    The caller never sees it: `run_in_worker` raises the caller's cancellation instead.
    """


def stop_requested() -> bool:
    """True inside a worker call whose caller has been cancelled (False outside workers)."""
    event = getattr(_current, "stop", None)
    return event is not None and event.is_set()


def current_stop() -> threading.Event | None:
    """The stop flag of the worker call running in this thread (None outside workers), for
    work this thread hands to another thread (the batching engine decodes elsewhere)."""
    return getattr(_current, "stop", None)


def check_stop() -> None:
    """Raise `WorkCancelled` when the current worker call's caller was cancelled."""
    if stop_requested():
        raise WorkCancelled("the caller was cancelled; stopping before the next model step")


@contextmanager
def serving_others() -> Iterator[None]:
    """Within the block this thread's forwards ignore its own caller's cancellation: it is
    doing other callers' work (a slot holder prefilling prompts that wait on it), which must
    not stop because this caller was cancelled. Its own result is dropped afterwards."""
    saved = getattr(_current, "stop", None)
    _current.stop = None
    try:
        yield
    finally:
        _current.stop = saved


async def run_in_worker(function: Callable[..., T], *args: object) -> T:
    """Await `function(*args)` in a thread; on cancellation stop it at its next model step,
    wait for it, then raise the cancellation.

    Both kinds of cancellation wait: a cancel scope's (anyio, trio) and plain asyncio's
    (`task.cancel()`, `asyncio.wait_for` timing out). The thread is awaited by a child task,
    never by the caller itself: anyio's shield holds against cancel scopes but not against
    native asyncio cancellation, which would otherwise raise out of the caller's await while
    the thread still held the model in its capture dispatch. The task group's exit waits for
    its children through any cancellation and raises it only once they are done.
    """
    stop = threading.Event()

    def call() -> T:
        outer = getattr(_current, "stop", None)
        _current.stop = stop
        try:
            return function(*args)
        finally:
            _current.stop = outer

    outcome: tuple[bool, object] | None = None

    async def work() -> None:
        nonlocal outcome
        try:
            outcome = (True, await anyio.to_thread.run_sync(call, abandon_on_cancel=False))
        except Exception as error:  # raised below, outside the task group (never as a group)
            outcome = (False, error)
        finally:
            stop.set()  # ends stop_on_cancel's wait (and, if cancelled, was set already)
            group.cancel_scope.cancel()

    async def stop_on_cancel() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            stop.set()

    async with anyio.create_task_group() as group:
        group.start_soon(stop_on_cancel)
        group.start_soon(work)
    # a native cancellation of the caller was raised by the task group's exit above; a
    # cancel scope's (which the group's own cancel above does not count as) is raised here
    await anyio.lowlevel.checkpoint_if_cancelled()
    assert outcome is not None
    succeeded, value = outcome
    if not succeeded:
        assert isinstance(value, Exception)
        raise value
    return value  # type: ignore[return-value]
