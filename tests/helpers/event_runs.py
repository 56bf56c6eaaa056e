"""A run with its event stream read as it goes, for tests that check what a run published.

The stream is bounded, so something must take its events while the run publishes them (a full
stream makes the run wait): `run_consumed` starts that consumer beside the run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from rclc_graph import Event, EventStream

T = TypeVar("T")


def run_consumed(run: Callable[[EventStream], Awaitable[T]]) -> tuple[T, list[Event]]:
    """`await run(events)` on a fresh event loop while a consumer takes every event: (what `run`
    returned, the events in order). E.g. `run_consumed(lambda events: run_plan(plan, events=events))`."""
    events = EventStream()
    seen: list[Any] = []

    async def main() -> T:
        async def consume() -> None:
            async for event in events:
                seen.append(event)

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            result = await run(events)
            events.close()
        return result

    return anyio.run(main), seen
