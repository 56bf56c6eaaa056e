"""The process-wide capture registry shared by the connector and the adapter.

The scheduler-side connector (which learns block IDs) and the worker-side connector
(which can read the pages) are two objects vLLM builds separately; in an in-process
engine they live in the same Python process as the caller. This registry is where the
three meet: callers register request IDs, the worker stores the copied pages, and the
adapter takes them out. Extraction failures are stored as data (a reason string) rather
than raised inside the engine step, so one bad capture never breaks the engine loop for
the other requests; `get_capture` raises them to the caller that asked.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ...errors import CaptureError, RclcError


@dataclass(frozen=True, eq=False)
class Capture:
    """The copied prompt KV of one request: `length` positions and, per layer in order,
    `(keys, values)` shaped `[1, kv_heads, length, head_dim]` (private copies, contiguous)."""

    request_id: str
    length: int
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]


# Marks a claimed request whose pages have not arrived yet (an object, so no reason string can equal it).
_PENDING: object = object()

_lock = threading.Lock()
_pending: set[str] = set()
_done: dict[str, object] = {}


def _check_id(request_id: object) -> str:
    if not isinstance(request_id, str) or not request_id:
        raise RclcError(f"request_id: expected a non-empty str (the engine's request ID), got {request_id!r}")
    return request_id


def request_capture(request_id: str) -> None:
    """Ask the connector to copy the prompt KV of `request_id` once its prompt is prefilled.

    Register before the engine first schedules the request (after `add_request`, before
    `step()`). Raises CaptureError if the ID is already registered or holds a result;
    call `discard_capture` first to reuse an ID.
    """
    _check_id(request_id)
    with _lock:
        if request_id in _pending:
            raise CaptureError(f"request_id: {request_id!r} is already registered for capture")
        if request_id in _done:
            raise CaptureError(
                f"request_id: {request_id!r} already holds a capture result; call discard_capture first"
            )
        _pending.add(request_id)


def get_capture(request_id: str) -> Capture:
    """The finished capture of `request_id` (the entry stays until released or discarded).

    CaptureError when the capture failed (with the connector's reason), is still pending,
    or was never registered.
    """
    _check_id(request_id)
    with _lock:
        result = _done.get(request_id)
        pending = request_id in _pending
    if isinstance(result, Capture):
        return result
    if isinstance(result, str):
        raise CaptureError(f"capture of request {request_id!r} failed: {result}")
    if pending:
        raise CaptureError(
            f"capture of request {request_id!r} is not finished: step the engine until its prompt is prefilled"
        )
    raise CaptureError(
        f"no capture for request {request_id!r}: register it with request_capture before the engine schedules it"
    )


def discard_capture(request_id: str) -> None:
    """Forget `request_id` everywhere (registration, result or failure); silent when absent."""
    _check_id(request_id)
    with _lock:
        _pending.discard(request_id)
        _done.pop(request_id, None)


def release_capture(request_id: str, capture: Capture) -> None:
    """Drop the entry only if it still holds `capture` (used after a successful hand-over)."""
    with _lock:
        if _done.get(request_id) is capture:
            del _done[request_id]


# ----- connector side --------------------------------------------------------------------


def take_registration(request_id: str) -> bool:
    """Scheduler side: claim a registered ID when its request is first scheduled."""
    with _lock:
        if request_id in _pending:
            _pending.discard(request_id)
            _done[request_id] = _PENDING
            return True
        return False


def is_tracked(request_id: str) -> bool:
    """Whether a claimed request still waits for its pages (not discarded meanwhile)."""
    with _lock:
        return _done.get(request_id) is _PENDING


def store_capture(capture: Capture) -> None:
    """Worker side: record the pages; dropped silently if the caller discarded the ID meanwhile."""
    with _lock:
        if _done.get(capture.request_id) is _PENDING:
            _done[capture.request_id] = capture


def store_failure(request_id: str, reason: str) -> None:
    """Record why a claimed capture could not be made (kept until discarded)."""
    with _lock:
        if _done.get(request_id) is _PENDING:
            _done[request_id] = reason


def entries() -> dict[str, str]:
    """A snapshot of every entry's state ('registered', 'pending', 'captured', 'failed'), for checks and tests."""
    with _lock:
        out = {request_id: "registered" for request_id in _pending}
        for request_id, result in _done.items():
            if isinstance(result, Capture):
                out[request_id] = "captured"
            elif result is _PENDING:
                out[request_id] = "pending"
            else:
                out[request_id] = "failed"
        return out
