"""The incident review graph of docs/graphs.md, written with the Python builder.

It builds the same spec as examples/topologies/incident_review.yaml (the script checks that),
runs it on the embedded model and records it under runs/ like `rclc-graph run` does.

Run: python examples/incident_review.py   (then: rclc-graph inspect runs/<run_id>)
"""

from __future__ import annotations

import json
from pathlib import Path

from rclc_graph import Graph, Policy, load_graph, run_recorded_sync

HERE = Path(__file__).resolve().parent


def build() -> Graph:
    graph = Graph("incident_review", description="readers hand compressed state to a drafter; an editor polishes the draft")
    graph.input("question", description="what the review must answer")
    graph.input("reports", "list[str]", description="one incident report per reader")
    graph.model("base", "embedded")
    graph.agent("reader", model="base", system="You read one incident report. Keep what helps answer the question.")
    graph.agent("drafter", model="base", max_new_tokens=48,
                system="Answer the question from the reports you were given, in one or two sentences.")
    graph.agent("editor", model="base", max_new_tokens=48,
                system="Rewrite the draft answer so it is short and clear. Keep every fact.")
    graph.policy("evidence", Policy(mode="state", budget=40, selector="cacheback", request="{question}"))
    graph.node("reader", agent="reader", foreach="reports", item="report", generate=False,
               prompt="Report {index}:\n{report}")
    graph.node("drafter", agent="drafter", prompt="Question: {question}\nDraft answer:")
    graph.node("editor", agent="editor", output=True, prompt="Question: {question}\nImproved answer:")
    graph.edge("reader", "drafter", "evidence")
    graph.edge("drafter", "editor", Policy(mode="text"))
    return graph


def main() -> None:
    graph = build()
    assert graph.spec() == load_graph(HERE / "topologies" / "incident_review.yaml"), "the YAML and the builder differ"
    inputs = json.loads((HERE / "inputs" / "incident_review.json").read_text())
    result, record, run_dir = run_recorded_sync(graph.plan(inputs), "runs")
    print(f"{result.status} in {result.seconds:.1f} s")
    for name, text in result.outputs.items():
        print(f"{name}: {text}")
    for hop in result.hops:
        if hop.mode == "text":
            print(f"{hop.source} -> {hop.target}: text, {hop.payload_bytes} bytes")
        else:
            print(f"{hop.source} -> {hop.target}: kept {hop.kept_positions} of {hop.total_positions} ({hop.policy})")
    print(f"record: {run_dir}/record.json\nreport: {run_dir}/report.html")


if __name__ == "__main__":
    main()
