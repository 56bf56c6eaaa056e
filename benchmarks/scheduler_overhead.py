"""Scheduler overhead per node: rclc_graph's anyio scheduler vs LangGraph, same chain, same run.

Both run a chain of N no-op async nodes (N = 100 and 1000) on asyncio:
- rclc_graph: a compiled chain-of-agents plan (N nodes, N - 1 state edges) driven by
  `run_plan` with an executor whose `run_node` returns an empty result at once, so only
  planning, task start-up, result passing and hop bookkeeping are measured (no events).
- LangGraph: a StateGraph of N async nodes that return an empty update, edges in a chain,
  compiled once and invoked with `ainvoke` (recursion limit raised to fit the chain).
Measurements alternate between the two (ours, theirs, ours, ...) so machine load hits both
alike; each figure is the median over repeats of wall time per node, in microseconds.

Target (issue 28; issue 4 asked 0.25x): rclc_graph per-node overhead at most 0.2x LangGraph's.

Run: python benchmarks/scheduler_overhead.py [--repeats 15] [--sizes 100 1000]
(LangGraph comes from the `bench` extra at the measured versions: `make bench`, which runs
pip install -c requirements/pins.txt -r requirements/pins-bench.txt).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rclc_graph import Lineage, NodeResult, chain_of_agents, run_plan  # noqa: E402
from rclc_graph.testing import FakeExecutor  # noqa: E402

TARGET_RATIO = 0.2


class NoopExecutor(FakeExecutor):
    """The test executor with node work cut to nothing: `run_node` returns an empty result at
    once, so a run measures the scheduler alone."""

    name = "noop"

    def __init__(self) -> None:
        super().__init__()
        self._empty = Lineage()

    async def run_node(self, ctx: Any, node: Any, inbound: list[Any]) -> NodeResult:
        return NodeResult(
            node=node.name, text="", positions=0, inherited_positions=0, lineage=self._empty,
            prompt_text="", prompt_start=0, prompt_offsets=[],
        )


def rclc_chain(nodes: int) -> Any:
    """A compiled plan of exactly `nodes` nodes in a chain (nodes - 1 workers + the final one)."""
    graph = chain_of_agents(nodes - 1)
    return graph.plan({"question": "q", "chunks": [f"chunk {index}" for index in range(nodes - 1)]})


def langgraph_chain(nodes: int) -> Any:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        value: int

    async def noop(state: State) -> dict[str, Any]:
        return {}

    builder = StateGraph(State)
    names = [f"n{index}" for index in range(nodes)]
    for name in names:
        builder.add_node(name, noop)
    builder.add_edge(START, names[0])
    for source, target in zip(names, names[1:]):
        builder.add_edge(source, target)
    builder.add_edge(names[-1], END)
    return builder.compile()


async def time_rclc(plan: Any, executor: NoopExecutor) -> float:
    began = time.perf_counter()
    result = await run_plan(plan, executor=executor, run_id="bench")
    seconds = time.perf_counter() - began
    if result.status != "finished" or len(result.nodes) != len(plan.nodes):
        raise RuntimeError(f"rclc_graph run did not finish all nodes: {result.status} {result.error}")
    return seconds


async def time_langgraph(graph: Any, nodes: int) -> float:
    config = {"recursion_limit": nodes + 10}
    began = time.perf_counter()
    await graph.ainvoke({"value": 0}, config=config)
    return time.perf_counter() - began


async def measure(sizes: list[int], repeats: int, warmup: int) -> list[dict[str, Any]]:
    results = []
    executor = NoopExecutor()
    for nodes in sizes:
        plan = rclc_chain(nodes)
        graph = langgraph_chain(nodes)
        for _ in range(warmup):
            await time_rclc(plan, executor)
            await time_langgraph(graph, nodes)
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(repeats):  # interleaved
            ours.append(await time_rclc(plan, executor))
            theirs.append(await time_langgraph(graph, nodes))
        ours_us = statistics.median(ours) / nodes * 1e6
        theirs_us = statistics.median(theirs) / nodes * 1e6
        ratio = ours_us / theirs_us
        results.append(
            {
                "nodes": nodes,
                "rclc_graph_us_per_node": round(ours_us, 2),
                "langgraph_us_per_node": round(theirs_us, 2),
                "ratio": round(ratio, 4),
                "meets_target": ratio <= TARGET_RATIO,
                "rclc_graph_us_per_node_min": round(min(ours) / nodes * 1e6, 2),
                "langgraph_us_per_node_min": round(min(theirs) / nodes * 1e6, 2),
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    options = parser.parse_args()
    try:
        langgraph_version = metadata.version("langgraph")
    except metadata.PackageNotFoundError:
        sys.exit("LangGraph is not installed: make bench (pip install -c requirements/pins.txt -r requirements/pins-bench.txt)")
    results = anyio.run(measure, options.sizes, options.repeats, options.warmup, backend="asyncio")
    report = {
        "benchmark": "scheduler_overhead",
        "what": "wall microseconds per node of a chain of no-op async nodes (median over repeats, interleaved)",
        "target_ratio": TARGET_RATIO,
        "meets_target": all(item["meets_target"] for item in results),
        "results": results,
        "repeats": options.repeats,
        "versions": {
            "langgraph": langgraph_version,
            "langchain_core": metadata.version("langchain-core"),
            "anyio": metadata.version("anyio"),
            "python": platform.python_version(),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
