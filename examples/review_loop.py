"""The review loop of topologies/review_loop.yaml, written with the Python builder, and the
human-in-the-loop step from Python.

A writer and a critic hand each other state until the critic's reply contains APPROVED (at
most 3 rounds); an editor then writes the final text, and the run waits for a person to
approve it (`interrupt: after`). The script checks that the builder gives the same spec as
the YAML file, runs it on the embedded model until it waits, prints the question, and
resumes it with the answer (the Python twin of `rclc-graph resume RUN_DIR --answer final=...`).

Run: python examples/review_loop.py ["your answer to the approval question"]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rclc_graph import Graph, Policy, load_graph, resume_run_sync, run_recorded_sync

ROOT = Path(__file__).resolve().parents[1]


def build() -> Graph:
    graph = Graph("review_loop", description="writer and critic hand state back and forth until the critic approves "
                                             "(at most 3 rounds); a person approves the result")
    graph.input("brief", description="what the announcement must say")
    graph.model("base", "embedded")
    graph.agent("writer", model="base", max_new_tokens=48,
                system="You write short product announcements of two or three sentences.")
    graph.agent("critic", model="base", max_new_tokens=24,
                system="You review announcements. If it follows the brief, reply APPROVED. Otherwise name one thing "
                       "to fix.")
    graph.agent("editor", model="base", max_new_tokens=48,
                system="You polish an announcement for publication. Keep every fact.")
    graph.policy("draft", Policy(mode="state", ratio=2))
    graph.node("writer", agent="writer",
               prompt="Brief: {brief}\nRound {round}: write the announcement (improve it if a review came with it):")
    graph.node("critic", agent="critic",
               prompt="Brief: {brief}\nDoes the announcement follow the brief? Reply APPROVED, or name one fix:")
    graph.node("final", agent="editor", output=True, interrupt="after",
               question="Approve this announcement for publication? Answer 'approved', or say what must change.",
               prompt="Write the final announcement:")
    graph.edge("writer", "critic", "draft")
    graph.edge("critic", "writer", "draft", rounds=3, until={"contains": "APPROVED"})
    graph.edge("writer", "final", Policy(mode="text"))
    graph.edge("critic", "final", Policy(mode="text"))
    return graph


def main(argv: list[str]) -> None:
    answer = argv[0] if argv else "approved"
    graph = build()
    assert graph.spec() == load_graph(ROOT / "topologies" / "review_loop.yaml"), "the YAML and the builder differ"
    inputs = json.loads((ROOT / "examples" / "inputs" / "review_loop.json").read_text())
    result, record, run_dir = run_recorded_sync(graph.plan(inputs), "runs")
    rounds = sorted({name.split("@")[1] for name in result.nodes if "@" in name})
    print(f"{result.status} after {len(rounds)} round(s) in {result.seconds:.1f} s")
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}")
    for item in result.waiting:
        print(f"{item['node']} asks: {item['question']}")
        for shown, text in item["shown"].items():
            print(f"  {shown}: {text}")
    print(f"answering {answer!r}")
    result, record, run_dir = resume_run_sync(run_dir, answers={"final": answer})
    print(f"{result.status}; nodes run by the resume: {record['attempts'][-1]['ran']}")
    for name, text in result.outputs.items():
        print(f"{name}: {text}")
    print(f"record: {run_dir}/record.json\nreport: {run_dir}/report.html")


if __name__ == "__main__":
    main(sys.argv[1:])
