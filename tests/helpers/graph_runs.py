"""Model-free runs for record, report and CLI tests: `rclc_graph.testing.FakeExecutor`, which
fakes node work but composes real lineage and hop records (every other position survives each
state hop), with texts that carry markup a report must escape."""

from __future__ import annotations

from typing import Any

import anyio

from rclc_graph import EventStream, Graph, Policy

from rclc_graph.testing import FakeExecutor as _FakeExecutor
from rclc_graph.testing import NodeReading, word_offsets

DANGER = '<script>alert("x")</script> & <b>bold</b> [red]markup[/red]'

tokens_of = word_offsets  # char spans of whitespace-delimited words, each with its trailing space


def _dangerous_answer(reading: NodeReading) -> str:
    return f"answer of {reading.node.name}: {DANGER}"


def FakeExecutor(**options: Any) -> _FakeExecutor:  # noqa: N802 - reads like the class it builds
    """The fake executor answering with `DANGER` in every generated text. `hang` names a node
    that never finishes (and, with `interrupt=True`, sends this process SIGINT once it
    started, as Ctrl-C would); `fail` a node that raises."""
    fail = options.pop("fail", None)
    return _FakeExecutor(text=_dangerous_answer, fail=() if fail is None else {fail}, **options)


CHAIN_YAML = """\
version: 1
name: small_chain
description: two readers and an answer
inputs:
  question: str
  chunks: list[str]
models:
  - {name: base, source: embedded}
agents:
  - {name: reader, model: base, max_new_tokens: 4}
  - {name: answerer, model: base, max_new_tokens: 4}
policies:
  handoff: {mode: state, ratio: 2}
nodes:
  - {name: reader_1, agent: reader, generate: false, prompt: "Question: {question} Part one: {chunks[0]}"}
  - {name: reader_2, agent: reader, generate: false, prompt: "Part two: {chunks[1]}"}
  - {name: final, agent: answerer, output: true, prompt: "Question: {question} Answer:"}
edges:
  - {source: reader_1, target: reader_2, policy: handoff}
  - {source: reader_2, target: final, policy: handoff}
"""

CHAIN_INPUTS = {"question": f"Who? {DANGER}", "chunks": [f"first {DANGER} part", "second part of the text"]}


def review_loop(rounds: int = 3) -> Graph:
    """A writer and a critic in a bounded loop of `rounds` rounds that stops once the critic
    writes APPROVED, and a final node reading both (text edges); input `brief`."""
    text = Policy(mode="text")
    graph = Graph("review").input("brief")
    graph.model("base").agent("a", model="base")
    graph.node("writer", agent="a", prompt="{brief} round {round}")
    graph.node("critic", agent="a", prompt="Review:")
    graph.node("final", agent="a", prompt="Final:", output=True)
    graph.edge("writer", "critic")
    graph.edge("critic", "writer", rounds=rounds, until={"contains": "APPROVED"})
    graph.edge("writer", "final", text)
    graph.edge("critic", "final", text)
    return graph


async def cancelled_once_started(node: str, run: Any) -> bool:
    """Run `run(events)` and cancel it once `node` has started: not after a delay, which a slow
    machine could outlast (a recorded run's senders reach disk before `node` starts:
    RecordingExecutor). True when the cancellation propagated out of `run` (it did not return)."""
    events, returned = EventStream(), []
    async with anyio.create_task_group() as group:
        async def cancel_when_started() -> None:
            async for event in events:
                if event.kind == "node" and event.payload == {"node": node, "status": "started"}:
                    group.cancel_scope.cancel()

        group.start_soon(cancel_when_started)
        await run(events)
        returned.append(True)
    return group.cancel_scope.cancelled_caught and not returned
