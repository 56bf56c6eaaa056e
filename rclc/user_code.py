"""Which callables a transfer may run concurrently: built-ins do, user code takes turns.

The seed's contract is that selection serializes across transfers. Since concurrent runs'
selections run in worker threads at once (the forward slots, `rclc._locks`), running
everything at once is right only for code we wrote and know to be thread-safe: the
built-in selectors (cacheback, qsnap, chunkkv and partials of them), the baselines
(`recent`, `random_selector`) and the built-in reasoning (`latent_mass`). A user's selector
or synchronous reasoning method runs in a worker thread and may keep state that two
threads must not touch at once, so it runs under one process-wide turn: at most one such
call at a time across every transfer of the process. An async reasoning method runs on
the caller's event loop, not in a worker thread, so it takes no turn: as the seed says, it
may await other work (another transfer among it) without holding a lock.

A user callable that is safe to run concurrently says so with `rclc.thread_safe(fn)`
(a decorator; also `thread_safe(functools.partial(...))`), and then runs beside the others.

The turn is re-entrant within one chain of calls: it is held in a context variable, which
anyio copies into worker threads, so user code that itself runs a transfer with another
user selector (through `rclc.transfer_sync`) does not wait for itself.

Torch-free.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .errors import RclcError

__all__ = ["is_thread_safe", "thread_safe"]

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "rclc_thread_safe"  # the attribute `thread_safe` sets
_turn = threading.Lock()  # one user callable at a time, process-wide
_holding: contextvars.ContextVar[bool] = contextvars.ContextVar("rclc_user_code_turn", default=False)


def thread_safe(fn: F) -> F:
    """Declare `fn` (a selector or a reasoning method) safe to run in several threads at once.

    Returns `fn` itself, marked; transfers then run it concurrently instead of one at a time.
    Works as a decorator, on a `functools.partial`, and on any callable object that takes
    attributes."""
    if not callable(fn):
        raise RclcError(f"thread_safe: expected a callable selector or reasoning method, got {type(fn).__name__}")
    try:
        setattr(fn, _MARK, True)
    except (AttributeError, TypeError):
        raise RclcError(
            f"thread_safe: {type(fn).__name__} takes no attributes; wrap it first: "
            "rclc.thread_safe(functools.partial(fn))"
        ) from None
    return fn


def is_thread_safe(fn: Any) -> bool:
    """Whether `fn`, or a `functools.partial` layer around it, was marked by `thread_safe`."""
    while True:
        if getattr(fn, _MARK, False) is True:
            return True
        if not isinstance(fn, functools.partial):
            return False
        fn = fn.func


def _exempt(fn: Any, builtin: bool) -> bool:
    return builtin or is_thread_safe(fn) or _holding.get()


@contextmanager
def user_code_turn(fn: Any, *, builtin: bool) -> Iterator[None]:
    """Hold the user-code turn while `fn` runs in this (worker) thread, unless it is exempt."""
    if _exempt(fn, builtin):
        yield
        return
    with _turn:
        token = _holding.set(True)
        try:
            yield
        finally:
            _holding.reset(token)
