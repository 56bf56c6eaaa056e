"""User code (function nodes, tools) in a thread of its own that a run can walk away from.

Python cannot stop a thread. A function node or tool that hangs therefore cannot be
killed; what a run can do is stop *waiting* for it the moment it is cancelled or its
timeout passes, and make sure the abandoned thread holds nothing up afterwards:

- the call runs in a new **daemon** thread, not in anyio's worker pool: pool threads are
  not daemons, so the interpreter's exit waited for a hanging call (Ctrl-C at 6 s, the CLI
  exited 39 s later), and a hung call held one of the pool's threads for good;
- the caller awaits an event the thread sets on the caller's loop when it returns, so a
  cancellation or a timeout ends the wait at once;
- an abandoned call's outcome is dropped: nothing the thread produces reaches the run, its
  events or its record (the thread only tells a loop that may have ended; that is all).

An async callable gets an event loop of its own in that thread (the caller's backend).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import sniffio

from ..errors import CallTimedOut


async def call_in_own_thread(call: Callable[[], Any], *, timeout: float | None, name: str,
                             is_async: bool = False) -> Any:
    """`call()` (or `anyio.run(call)` when `is_async`) in a daemon thread; its value, or what it
    raised. Raises CallTimedOut after `timeout` seconds (None: no limit); a cancelled caller
    stops waiting at once. Either way the thread is left to finish on its own."""
    token = anyio.lowlevel.current_token()
    backend = sniffio.current_async_library()
    returned = anyio.Event()
    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, anyio.run(call, backend=backend) if is_async else call()))
        except BaseException as error:  # noqa: BLE001 - handed to the caller, who decides
            outcome.append((False, error))
        # The caller's loop may have ended (an abandoned call): then there is nobody to tell.
        with contextlib.suppress(Exception):
            anyio.from_thread.run_sync(returned.set, token=token)

    threading.Thread(target=target, name=f"rclc-graph {name}", daemon=True).start()
    try:
        with anyio.fail_after(timeout):
            await returned.wait()
    except TimeoutError:
        raise CallTimedOut(f"{name} did not return within {timeout:g} s") from None
    succeeded, value = outcome[0]
    if succeeded:
        return value
    raise value
