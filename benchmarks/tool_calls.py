"""How often does the embedded model call the tool correctly? (tool_agent's support agent, measured)

Workload: the support node of topologies/tool_agent.yaml (SmolLM2-135M-Instruct, fp32 on CPU,
greedy, its tools described in plain text because SmolLM2's chat template has no tool format)
on 12 customer questions about orders and customers in examples/shop.sqlite. For each one the
node runs its real tool loop (the tools really query the database), and we count:

- called:          the first turn contains a tool call rclc-graph could parse;
- right_tool:      that call names the tool the question needs;
- right_arguments: ... with the argument the question gives (the order number or customer name);
- answer_has_fact: the node's final text contains the fact the database holds (status, date,
                   product or order number), whatever the route to it.

Prints one JSON object: the counts, the rates, and every case's first turn and final text.

Run: PYTHONPATH=examples python benchmarks/tool_calls.py [--cases N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from rclc_graph import ModelPool, load_graph, run_plan_sync  # noqa: E402
from rclc_graph.plan.compile import compile_plan  # noqa: E402

# (question, tool it needs, argument it gives, a fact the database holds for it)
CASES = [
    ("Where is my order A-1002? When will it arrive?", "lookup_order", {"order_id": "A-1002"}, "2026-11-21"),
    ("What did I buy in order A-1005?", "lookup_order", {"order_id": "A-1005"}, "standing desk"),
    ("Has order A-1001 been delivered?", "lookup_order", {"order_id": "A-1001"}, "delivered"),
    ("Why was my order A-1004 cancelled? What was in it?", "lookup_order", {"order_id": "A-1004"}, "monitor arm"),
    ("Which carrier ships order A-1008?", "lookup_order", {"order_id": "A-1008"}, "Yamato"),
    ("What is the total of order A-1003?", "lookup_order", {"order_id": "A-1003"}, "148.00"),
    ("Is order A-1006 on its way yet?", "lookup_order", {"order_id": "A-1006"}, "processing"),
    ("Order A-1007: what was in it?", "lookup_order", {"order_id": "A-1007"}, "headphones"),
    ("Which orders does Jonas Berg have?", "orders_of_customer", {"name": "Jonas Berg"}, "A-1007"),
    ("I am Maria Lopez. What are my orders?", "orders_of_customer", {"name": "Maria Lopez"}, "A-1006"),
    ("List the orders of Aiko Tanaka.", "orders_of_customer", {"name": "Aiko Tanaka"}, "A-1008"),
    ("Does Chloe Martin have an order that was shipped?", "orders_of_customer", {"name": "Chloe Martin"}, "A-1005"),
]


def support_only():
    """tool_agent.yaml with the support node as the output (the writer is not measured here)."""
    spec = load_graph(ROOT / "topologies" / "tool_agent.yaml")
    nodes = [node.model_copy(update={"output": True}) for node in spec.nodes if node.name == "support"]
    return spec.model_copy(update={"nodes": nodes, "edges": [], "policies": {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=len(CASES), help="measure the first N cases")
    arguments = parser.parse_args()
    spec = support_only()
    pool = ModelPool()
    rows = []
    began = time.perf_counter()
    for question, tool, expected, fact in CASES[: arguments.cases]:
        result = run_plan_sync(compile_plan(spec, {"question": question}, trust_code=True), pool=pool)
        node = result.nodes["support"]
        first = node.tool_calls[0] if node.tool_calls else None
        given = {key: str(value).strip().lower() for key, value in (first or {}).get("arguments", {}).items()}
        rows.append({
            "question": question,
            "called": first is not None,
            "right_tool": first is not None and first["name"] == tool,
            "right_arguments": first is not None and first["name"] == tool
            and given == {key: value.lower() for key, value in expected.items()},
            "answer_has_fact": fact.lower() in (node.text or "").lower(),
            "calls": [{"name": call["name"], "arguments": call["arguments"], "error": call["error"]}
                      for call in node.tool_calls],
            "text": node.text,
        })
    total = len(rows)
    counts = {key: sum(row[key] for row in rows) for key in ("called", "right_tool", "right_arguments",
                                                              "answer_has_fact")}
    print(json.dumps({
        "model": "embedded (SmolLM2-135M-Instruct)",
        "cases": total,
        "counts": counts,
        "rates": {key: round(value / total, 3) for key, value in counts.items()},
        "seconds": round(time.perf_counter() - began, 1),
        "rows": rows,
    }, indent=2))


if __name__ == "__main__":
    main()
