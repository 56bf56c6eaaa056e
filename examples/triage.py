"""The triage graph of topologies/triage.yaml, written with the Python builder.

A triage agent says what a customer message is about; two conditional edges (`when`) send its
whole state to the billing or the technical specialist, so exactly one of them runs and the
other is skipped. The script checks that the builder gives the same spec as the YAML file,
runs it on the embedded model and records it under runs/ like `rclc-graph run` does.

Run: python examples/triage.py ["a customer message"]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rclc_graph import Graph, Policy, load_graph, run_recorded_sync

ROOT = Path(__file__).resolve().parents[1]
MONEY = r"(?i)\b(bill|pay|charg|invoice|refund|price|receipt|discount|money|subscription)"


def build() -> Graph:
    graph = Graph("triage", description="a triage agent routes a customer message to the billing or the technical "
                                        "specialist")
    graph.input("message", description="the customer's message")
    graph.model("base", "embedded")
    graph.agent("triage", model="base", system="Classify support tickets as billing or technical.", max_new_tokens=24)
    graph.agent("billing", model="base", max_new_tokens=48,
                system="You are a billing specialist. Answer the customer in two short sentences.")
    graph.agent("technical", model="base", max_new_tokens=48,
                system="You are a technical support specialist. Answer the customer in two short sentences.")
    graph.policy("handover", Policy(mode="full"))
    graph.node("triage", agent="triage", prompt="Ticket: {message}\nThe ticket is about")
    graph.node("billing", agent="billing", output=True, prompt="Reply to the customer about their bill:")
    graph.node("technical", agent="technical", output=True,
               prompt="Reply to the customer about their technical problem:")
    graph.edge("triage", "billing", "handover", when={"matches": MONEY})
    graph.edge("triage", "technical", "handover", when={"not": {"matches": MONEY}})
    return graph


def main(argv: list[str]) -> None:
    graph = build()
    assert graph.spec() == load_graph(ROOT / "topologies" / "triage.yaml"), "the YAML and the builder differ"
    inputs = json.loads((ROOT / "examples" / "inputs" / "triage.json").read_text())
    if argv:
        inputs["message"] = argv[0]
    result, record, run_dir = run_recorded_sync(graph.plan(inputs), "runs")
    print(f"{result.status} in {result.seconds:.1f} s")
    print(f"triage: {result.nodes['triage'].text}")
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {reason}")
    for name, text in result.outputs.items():
        print(f"{name}: {text}")
    print(f"record: {run_dir}/record.json\nreport: {run_dir}/report.html")


if __name__ == "__main__":
    main(sys.argv[1:])
