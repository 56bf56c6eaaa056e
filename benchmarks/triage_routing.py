"""How often a triage topology sends a labelled case to the right specialist, on the embedded model.

Each case of a JSONL file ({"id", "route", "message"}) is planned with the topology (its
`message` input) and run with the local executor; the route taken is the output node that ran
(the conditional edges skip the other). Generation is greedy, so the figure is exact for this
model, these prompts and these cases; it is not a claim about other models.

`--route-only` lowers every specialist's max_new_tokens to 1: routing is decided from the
triage node's output before any specialist runs, so the routes are the same and the run is
faster. Prints one JSON document: accuracy, per route, and every mistake with what the
triage agent wrote.

Run: python benchmarks/triage_routing.py [--topology topologies/triage.yaml]
     [--cases examples/data/triage_cases.jsonl] [--route-only]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rclc_graph import compile_plan, default_pool, load_graph, run_plan_sync  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", type=Path, default=ROOT / "topologies" / "triage.yaml")
    parser.add_argument("--cases", type=Path, default=ROOT / "examples" / "data" / "triage_cases.jsonl")
    parser.add_argument("--route-only", action="store_true", help="specialists generate 1 token (routes unchanged)")
    arguments = parser.parse_args()
    spec = load_graph(arguments.topology)
    routes = [node.name for node in spec.nodes if node.output]
    if arguments.route_only:
        routed = {node.agent for node in spec.nodes if node.output}
        agents = [agent.model_copy(update={"max_new_tokens": 1}) if agent.name in routed else agent
                  for agent in spec.agents]
        spec = spec.model_copy(update={"agents": agents})
    cases = [json.loads(line) for line in arguments.cases.read_text().splitlines() if line.strip()]
    pool = default_pool()
    began = time.perf_counter()
    rows = []
    for case in cases:
        result = run_plan_sync(compile_plan(spec, {"message": case["message"]}), pool=pool)
        if result.status != "finished":
            raise SystemExit(f"case {case['id']}: the run {result.status}: {result.error}")
        chosen = [name for name in routes if name in result.nodes]
        first = next(node for node in spec.nodes if not node.output).name
        rows.append({"id": case["id"], "route": case["route"], "chose": chosen,
                     "triage_text": result.nodes[first].text})
    correct = [row for row in rows if row["chose"] == [row["route"]]]
    by_route = {
        route: {"cases": sum(row["route"] == route for row in rows),
                "correct": sum(row["route"] == route for row in correct)}
        for route in routes
    }
    print(json.dumps({
        "topology": str(arguments.topology.relative_to(ROOT) if arguments.topology.is_relative_to(ROOT)
                        else arguments.topology),
        "cases": len(rows),
        "correct": len(correct),
        "accuracy": round(len(correct) / len(rows), 3),
        "by_route": by_route,
        "mistakes": [row for row in rows if row not in correct],
        "route_only": arguments.route_only,
        "seconds": round(time.perf_counter() - began, 1),
    }, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
