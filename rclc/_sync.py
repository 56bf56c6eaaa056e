"""Run an async function to completion from synchronous code, with or without a running loop.

Public as `rclc.call_sync`; every `*_sync` entry point of rclc and rclc_graph goes through it.

`anyio.run` refuses to start a loop in a thread whose loop is already running (every Jupyter
cell, any sync helper called from async code), with anyio's bare "Already running asyncio in
this thread". There the call runs in a fresh worker thread with its own event loop instead,
and the caller's thread waits for it: the sync call behaves the same everywhere. Objects that
belong to the caller's loop cannot be used inside (the caller's loop is blocked while it
waits), which is why the sync twins refuse an `EventStream` (see `rclc_graph.stream`).

The worker copies the caller's context variables (logging and tracing context follow the
call). A KeyboardInterrupt while waiting cancels the worker's loop, waits for it to wind down
(the core's cancellation contract: worker threads finish their model step), then re-raises.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

try:  # anyio finds "the running loop" through sniffio's context variable when sniffio is installed
    from sniffio import current_async_library_cvar as _LIBRARY
except ImportError:  # pragma: no cover - anyio then asks asyncio, which is per thread anyway
    _LIBRARY = None

T = TypeVar("T")


def loop_running() -> bool:
    """Whether this thread is running an event loop (asyncio or trio) right now."""
    try:
        asyncio.get_running_loop()  # also a loop running callbacks outside any task
    except RuntimeError:
        pass
    else:
        return True
    try:
        anyio.lowlevel.current_token()  # trio (and any other loop anyio knows)
    except RuntimeError:
        return False
    return True


class _Worker:
    """One call on its own event loop in its own thread; the caller joins it."""

    def __init__(self, call: Callable[[], Awaitable[Any]]) -> None:
        self.call = call
        self.outcome: tuple[bool, Any] | None = None
        self.token: Any = None
        self.scope: anyio.CancelScope | None = None
        self.started = threading.Event()

    async def _main(self) -> Any:
        self.token = anyio.lowlevel.current_token()
        with anyio.CancelScope() as scope:
            self.scope = scope
            self.started.set()
            return await self.call()
        raise KeyboardInterrupt  # only reached when cancel() cancelled the scope

    def run(self) -> None:
        if _LIBRARY is not None:  # the copied context says "asyncio" (the caller's loop): not in this thread
            _LIBRARY.set(None)
        try:
            self.outcome = (True, anyio.run(self._main))
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread as is
            self.outcome = (False, error)
        finally:
            self.started.set()

    def cancel(self) -> None:
        self.started.wait()
        if self.scope is not None and self.token is not None:
            try:
                anyio.from_thread.run_sync(self.scope.cancel, token=self.token)
            except RuntimeError:
                pass  # the loop already ended


def call_sync(function: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
    """`await function(*args, **kwargs)` from synchronous code, and return its result.

    Without a running event loop in this thread it runs here (`anyio.run`, asyncio). With one
    (Jupyter, a sync helper called from async code) it runs on a new event loop in a worker
    thread while this thread waits, so the caller never meets anyio's "Already running
    asyncio in this thread". Exceptions propagate unchanged.
    """
    call = functools.partial(function, *args, **kwargs)
    if not loop_running():
        return anyio.run(call)
    worker = _Worker(call)
    context = contextvars.copy_context()
    name = getattr(function, "__name__", "call")
    thread = threading.Thread(target=context.run, args=(worker.run,), name=f"rclc-sync-{name}", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)  # short joins keep this thread responsive to KeyboardInterrupt
    except KeyboardInterrupt:
        worker.cancel()
        thread.join()
        raise
    assert worker.outcome is not None
    ok, value = worker.outcome
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
