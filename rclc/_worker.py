"""Run blocking model work in a worker thread with the core's cancellation contract.

A cancelled caller does not abandon the thread: model state (attention dispatch, caches)
is only consistent once the worker has finished and restored it. So the wait is shielded,
and the caller's cancellation is raised only after the worker returns, before anything
the worker produced can be delivered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

T = TypeVar("T")


async def run_in_worker(function: Callable[..., T], *args: object) -> T:
    """Await `function(*args)` in a thread; on cancellation wait for it, then raise."""
    result = await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=False)
    await anyio.lowlevel.checkpoint_if_cancelled()
    return result
