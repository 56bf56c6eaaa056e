"""Does the embedded model call tools correctly? Free text against constrained tool calls.

Workload: the support node of topologies/tool_agent.yaml (SmolLM2-135M-Instruct, fp32 on CPU,
greedy, its two tools described in plain text because SmolLM2's chat template has no tool
format) on customer questions about examples/shop.sqlite, in three arms side by side:

- free:     constrain_tools: false, the loop reads calls from free text (the behaviour
            before issue 27);
- auto:     constrained, tool_choice: auto: each turn is a call matching one tool's
            signature, or an answer (the model's first token decides);
- required: constrained, tool_choice: required: the first turn must be a call (the shipped
            topology's setting).

Two fixed sets of questions: `dev`, the 12 questions used while building the feature
(choosing tool_choice for the topology, the call format), and `test`, 44 questions made
from the database with templates after those choices and measured once. For each case the
node runs its real tool loop (the tools query the database) and we count:

- called:          the first turn holds a tool call rclc-graph parsed;
- valid_call:      ... naming one of the tools, its arguments matching that tool's JSON
                   schema (jsonschema, no parameters beyond the declared ones);
- right_tool:      ... and it is the tool the question needs;
- right_arguments: ... with the question's order number or customer name as the argument;
- any_call_right:  some call of the node (the first, or a retry after an error result) was
                   the right tool with the right argument, and returned without an error;
- answer_has_fact: the node's final text holds the fact the database has for the question.

`valid_call` is what the grammar guarantees; the last three are the model's own choices,
which the grammar cannot make for it. Cases of an arm run concurrently (the batching engine
decodes them together); a progress line per finished case goes to stderr. Prints one JSON
object: counts and rates per arm and set, and every case's first call and final text.

Run: PYTHONPATH=examples python benchmarks/tool_calls.py [--sets dev,test] [--arms free,auto,required]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import anyio  # noqa: E402
import jsonschema  # noqa: E402

from rclc_graph import ModelPool, load_graph  # noqa: E402
from rclc_graph.executors.tools import describe_function  # noqa: E402
from rclc_graph.plan.compile import compile_plan  # noqa: E402
from rclc_graph.run.scheduler import run_plan  # noqa: E402

import shop_tools  # noqa: E402

# (question, tool it needs, argument it gives, a fact the database holds for it)
DEV = [
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
ORDER_TEMPLATES = [  # (question, which fact of the order answers it)
    ("What is the status of order {id}?", "status"),
    ("Which items are in my order {id}?", "item"),
    ("When did I place order {id}?", "placed_on"),
]
CUSTOMER_TEMPLATES = [
    "Show me the orders of {name}.",
    "{name} here. Which orders have I placed?",
    "What orders does {name} have with the shop?",
    "Please look up the orders for the customer {name}.",
]


def test_cases() -> list[tuple[str, str, dict[str, str], str]]:
    """44 questions from the database: 8 orders x 3 templates, 5 customers x 4 templates."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(f"file:{shop_tools.DATABASE}?mode=ro", uri=True)) as connection:
        orders = connection.execute(
            "SELECT orders.id, customers.name, status, placed_on, (SELECT product FROM items WHERE order_id = orders.id "
            "ORDER BY rowid LIMIT 1) FROM orders JOIN customers ON customers.id = orders.customer_id ORDER BY orders.id"
        ).fetchall()
    cases = []
    for number, _, status, placed_on, item in orders:
        facts = {"status": status, "item": item, "placed_on": placed_on}
        for template, fact in ORDER_TEMPLATES:
            cases.append((template.format(id=number), "lookup_order", {"order_id": number}, facts[fact]))
    latest: dict[str, str] = {}
    for number, name, *_ in orders:
        latest[name] = number  # orders are numbered in time order: the last one seen is the newest
    for name, number in latest.items():
        for template in CUSTOMER_TEMPLATES:
            cases.append((template.format(name=name), "orders_of_customer", {"name": name}, number))
    return cases


ARMS = {
    "free": {"constrain_tools": False},
    "auto": {"constrain_tools": True, "tool_choice": "auto"},
    "required": {"constrain_tools": True, "tool_choice": "required"},
}
SCHEMAS = {schema["function"]["name"]: schema["function"]["parameters"] for schema in (
    describe_function(shop_tools.lookup_order, "shop_tools:lookup_order"),
    describe_function(shop_tools.orders_of_customer, "shop_tools:orders_of_customer"),
)}


def support_only(arm: dict[str, Any]) -> Any:
    """tool_agent.yaml with the support node as the output (the writer is not measured here)."""
    spec = load_graph(ROOT / "topologies" / "tool_agent.yaml")
    agents = [agent.model_copy(update=arm) if agent.name == "support" else agent for agent in spec.agents]
    nodes = [node.model_copy(update={"output": True}) for node in spec.nodes if node.name == "support"]
    return spec.model_copy(update={"agents": agents, "nodes": nodes, "edges": [], "policies": {}})


def valid_call(call: dict[str, Any] | None) -> bool:
    """The call names a tool and its arguments match that tool's schema (nothing undeclared)."""
    if call is None or call.get("name") not in SCHEMAS or (call.get("error") or "").startswith("bad arguments"):
        return False
    schema = {**SCHEMAS[call["name"]], "additionalProperties": False}
    try:
        jsonschema.validate(call["arguments"], schema)
    except jsonschema.ValidationError:
        return False
    return True


def score(case: tuple[str, str, dict[str, str], str], node: Any) -> dict[str, Any]:
    question, tool, expected, fact = case
    first = node.tool_calls[0] if node.tool_calls else None
    given = {key: str(value).strip().lower() for key, value in (first or {}).get("arguments", {}).items()}
    right_tool = first is not None and first["name"] == tool
    wanted = {key: value.lower() for key, value in expected.items()}
    any_right = any(call["name"] == tool and call["error"] is None
                    and {key: str(value).strip().lower() for key, value in call["arguments"].items()} == wanted
                    for call in node.tool_calls)
    return {
        "question": question,
        "called": first is not None,
        "valid_call": valid_call(first),
        "right_tool": right_tool,
        "right_arguments": right_tool and given == wanted,
        "any_call_right": any_right,
        "answer_has_fact": fact.lower() in (node.text or "").lower(),
        "calls": [{"name": call["name"], "arguments": call["arguments"], "error": call["error"]}
                  for call in node.tool_calls],
        "text": node.text,
    }


async def run_arm(name: str, cases: list, pool: ModelPool, concurrency: int) -> list[dict[str, Any]]:
    spec = support_only(ARMS[name])
    rows: list[dict[str, Any] | None] = [None] * len(cases)
    limit = anyio.Semaphore(concurrency)
    began = time.perf_counter()

    async def one(index: int) -> None:
        async with limit:
            result = await run_plan(compile_plan(spec, {"question": cases[index][0]}, trust_code=True), pool=pool)
        if result.status != "finished":
            raise RuntimeError(f"{name} case {index}: {result.status}: {result.error}")
        rows[index] = score(cases[index], result.nodes["support"])
        done = sum(row is not None for row in rows)
        print(f"[{name}] {done}/{len(cases)} cases, {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as group:
        for index in range(len(cases)):
            group.start_soon(one, index)
    return [row for row in rows if row is not None]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("called", "valid_call", "right_tool", "right_arguments", "any_call_right", "answer_has_fact")
    counts = {key: sum(row[key] for row in rows) for key in keys}
    return {"cases": len(rows), "counts": counts, "rates": {key: round(counts[key] / len(rows), 3) for key in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="dev,test", help="comma-separated: dev, test")
    parser.add_argument("--arms", default="free,auto,required", help=f"comma-separated: {', '.join(ARMS)}")
    parser.add_argument("--concurrency", type=int, default=16, help="cases of an arm running at once")
    parser.add_argument("--limit", type=int, default=None, help="only the first N cases of each set (a smoke run)")
    arguments = parser.parse_args()
    sets = {"dev": DEV[: arguments.limit], "test": test_cases()[: arguments.limit]}
    pool = ModelPool()
    began = time.perf_counter()
    report: dict[str, Any] = {"model": "embedded (SmolLM2-135M-Instruct)", "results": {}}
    for arm in arguments.arms.split(","):
        for set_name in arguments.sets.split(","):
            rows = anyio.run(run_arm, arm, sets[set_name], pool, arguments.concurrency)
            report["results"].setdefault(arm, {})[set_name] = {**summary(rows), "rows": rows}
    report["seconds"] = round(time.perf_counter() - began, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
