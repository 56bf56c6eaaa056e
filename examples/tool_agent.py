"""The tool_agent graph (topologies/tool_agent.yaml), written with the Python builder.

A support agent looks the customer's order up in the shop's SQLite database
(examples/shop.sqlite, built by scripts/build_shop_db.py) with the functions in
shop_tools.py, then hands its state, tool results included, to a writer that answers the
customer. The builder takes the tool functions themselves; the spec names them by import
(`shop_tools:lookup_order`), so it equals the YAML file's (the script checks that).

Run: python examples/tool_agent.py   (then: rclc-graph inspect runs/<run_id>)
"""

from __future__ import annotations

import json
from pathlib import Path

from shop_tools import lookup_order, orders_of_customer  # this directory is on sys.path when run as a script

from rclc_graph import Graph, Policy, load_graph, run_recorded_sync

# The writer's structured reply (output_schema), as the YAML file writes it in JSON Schema.
REPLY_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^A-[0-9]{4}$"},
        "status": {"enum": ["processing", "shipped", "delivered", "cancelled", "unknown"]},
        "expected_delivery": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "message": {"type": "string", "maxLength": 160},
    },
    "required": ["order_id", "status", "expected_delivery", "message"],
}

HERE = Path(__file__).resolve().parent


def build() -> Graph:
    graph = Graph("tool_agent", description="a support agent looks the order up in a SQLite database with a tool; "
                                            "a writer answers from its state")
    graph.input("question")
    graph.model("base", "embedded")
    graph.agent("support", model="base", max_new_tokens=64, tools=[lookup_order, orders_of_customer],
                tool_choice="required", max_tool_calls=2, tool_timeout=10,
                system="You are the support agent of an online shop. Look orders up with the tools instead of guessing.")
    graph.agent("writer", model="base", max_new_tokens=128,
                system="You write short, friendly replies to customers of an online shop, using only the facts you "
                       "were given.")
    graph.policy("findings", Policy(mode="state", budget=256, request="{question}"))
    graph.node("support", agent="support", prompt="Customer: {question}")
    graph.node("reply", agent="writer", output=True, output_schema=REPLY_SCHEMA,
               prompt="Reply to the customer's question with the order details you were given: {question}")
    graph.edge("support", "reply", "findings")
    return graph


def main() -> None:
    graph = build()
    assert graph.spec() == load_graph(HERE.parent / "topologies" / "tool_agent.yaml"), "the YAML and the builder differ"
    inputs = json.loads((HERE / "inputs" / "tool_agent.json").read_text())
    result, record, run_dir = run_recorded_sync(graph.plan(inputs, trust_code=True), "runs")
    print(f"{result.status} in {result.seconds:.1f} s")
    for call in result.nodes["support"].tool_calls:
        print(f"tool call {call['call_id']}: {call['name']}({json.dumps(call['arguments'])}) -> "
              f"{call['error'] or call['result']}")
    for name, text in result.outputs.items():
        print(f"{name}: {text}")
    print(f"record: {run_dir}/record.json\nreport: {run_dir}/report.html")


if __name__ == "__main__":
    main()
