"""Shared pieces of the HF batching engine's tests (test_batching_engine.py,
test_constrained_decoding.py, test_agent_generate.py): prompts of different lengths, one
generation alone, several at once on one engine, the float32 near-tie rule for comparing
batched with unbatched tokens, and the rows a decode step forwards for chosen sequences."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Awaitable, Callable

import anyio

import rclc
# private on purpose: the decoder a forward hook watches and the engine's batch (no public API)
from rclc._cache import backbone
from rclc.backends.hf_batching import engine_for

PROMPTS = [
    "Short one.",
    "A somewhat longer prompt that takes more positions than the first.",
    "Middle length prompt here.",
    "The longest prompt of all, with many words, so that it needs the widest window in the batch of all three.",
]


def generate_alone(model: Any, tokenizer: Any, prompt: str, **options: Any) -> Any:
    """One generation on its own agent and its own event loop (the unbatched reference)."""
    return anyio.run(lambda: rclc.bind(model, tokenizer).generate(prompt, **options))


def concurrently(agents: list[Any], prompts: list[str], options: list[dict[str, Any]],
                 before: Callable[[Any], Awaitable[None]] | None = None) -> list[Any]:
    """Generate on every agent at once; return their results (or exceptions) in order.
    `before(group)` runs in the task group once every generation is started."""
    results: list[Any] = [None] * len(agents)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for index, agent in enumerate(agents):
                async def one(index: int = index, agent: Any = agent) -> None:
                    try:
                        results[index] = await agent.generate(prompts[index], **options[index])
                    except Exception as error:  # reported, not raised: the test names which one failed
                        results[index] = error
                group.start_soon(one)
            if before is not None:
                await before(group)

    anyio.run(main)
    return results


def assert_equal_or_near_tie(batched: list[int], alone: list[int], trace: Any) -> None:
    """Tokens equal, or they differ first where the unbatched logits were a float32 near-tie."""
    if batched == alone:
        return
    first = next(i for i, (a, b) in enumerate(zip(batched, alone)) if a != b)
    margins = [entry.margins for entry in trace if entry.tokens == tuple(alone)]
    assert margins and margins[0][first] < 1e-4, (first, batched, alone)


@contextmanager
def decode_rows_of(model: Any, chosen: Callable[[Any], bool]) -> Iterator[list[int]]:
    """Inside: one entry per row of a decode step (begun in the engine's decode thread) whose
    sequence `chosen(sequence)` accepts when the step begins. A test that stops or cancels a
    generation counts its rows after the fact (`sequence.gone()`, its stop event set) instead
    of its tokens, which depend on how far the engine ran ahead of the caller."""
    engine, rows = engine_for(model), []

    def count(module: Any, args: Any) -> None:
        if threading.current_thread().name == "rclc-batching-decode":
            rows.extend(1 for sequence in engine._active if chosen(sequence))

    handle = backbone(model).register_forward_pre_hook(count)
    try:
        yield rows
    finally:
        handle.remove()
