"""Shared pieces of the HF batching engine's tests (test_batching_engine.py,
test_constrained_decoding.py): prompts of different lengths, one generation alone, several at
once on one engine, and the float32 near-tie rule for comparing batched with unbatched tokens."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import anyio

import rclc

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
