"""Model-free runs for record, report and CLI tests: `rclc_graph.testing.FakeExecutor`, which
fakes node work but composes real lineage and hop records (every other position survives each
state hop), with texts that carry markup a report must escape."""

from __future__ import annotations

from typing import Any

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
