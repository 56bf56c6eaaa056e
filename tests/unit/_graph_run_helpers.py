"""Model-free runs for record, report and CLI tests: an executor that fakes node work but
composes real lineage and hop records (every other position survives each state hop)."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import anyio

from rclc_graph import Lineage, NodeResult, compose_hop

DANGER = '<script>alert("x")</script> & <b>bold</b> [red]markup[/red]'


def tokens_of(text: str) -> list[tuple[int, int]]:
    """Char spans of whitespace-delimited words (each with its trailing space), like offsets."""
    return [(match.start(), match.end()) for match in re.finditer(r"\S+\s*", text)]


class FakeExecutor:
    """Runs nodes without a model. `hang` names a node that never finishes (and, with
    `interrupt=True`, sends this process SIGINT once it started, as Ctrl-C would)."""

    name = "fake"

    def __init__(self, *, hang: str | None = None, interrupt: bool = False, fail: str | None = None) -> None:
        self.hang, self.interrupt, self.fail = hang, interrupt, fail
        self.released: list[str] = []

    async def run_node(self, ctx: Any, node: Any, inbound: list[tuple[Any, NodeResult]]) -> NodeResult:
        if node.name == self.fail:
            raise RuntimeError(f"{node.name} broke")
        if node.name == self.hang:
            if self.interrupt:
                await anyio.sleep(0.05)
                os.kill(os.getpid(), signal.SIGINT)
            await anyio.sleep_forever()
        hops = []
        for edge, sender in inbound:
            if edge.policy.mode == "text":
                hops.append(compose_hop(Lineage(), [], source=edge.source, target=node.name, inherited_positions=0,
                                        budget=0, payload_bytes=len((sender.text or "").encode()), mode="text",
                                        policy="text", edge=edge.id))
                continue
            kept = list(range(0, len(sender.lineage), 2))
            hops.append(compose_hop(sender.lineage, kept, source=edge.source, target=node.name,
                                    inherited_positions=sender.inherited_positions, budget=len(kept),
                                    payload_bytes=8 * len(kept), mode=edge.policy.mode, policy=edge.policy.label,
                                    edge=edge.id, selection_seconds=0.001))
        inherited = sum(hop.record.kept_positions for hop in hops if hop.record.mode != "text")
        prompt = node.prompt
        offsets = tokens_of(prompt)
        generated = 3 if node.generate else 0
        lineage = Lineage.join([hop.lineage for hop in hops if hop.record.mode != "text"])
        lineage = lineage.extend(node.name, len(offsets), "prompt").extend(node.name, generated, "token")
        return NodeResult(
            node=node.name,
            text=f"answer of {node.name}: {DANGER}" if node.generate else None,
            positions=len(lineage),
            inherited_positions=inherited,
            lineage=lineage,
            prompt_text=prompt,
            prompt_start=inherited,
            prompt_offsets=offsets,
            generated_tokens=generated,
            generation_seconds=0.002 if node.generate else 0.0,
            started_at=1_700_000_000.0,
            finished_at=1_700_000_000.5,
            hops=[hop.record for hop in hops],
        )

    def release(self, run_id: str) -> None:
        self.released.append(run_id)


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
