"""Concurrent graph runs on the vLLM backend (issue 14): fanout_qa runs one after another vs
the same runs at once on one engine. The concurrent runs answer as the sequential ones
(greedy), their requests were in the engine together (steps with several requests), and
the runs-per-minute ratio is printed (a figure, never asserted: the machine is shared).
The full-size comparison is `benchmarks/concurrent_runs.py --backend vllm`."""

from __future__ import annotations

import dataclasses
import time

import anyio
import pytest

import rclc
from rclc.vllm.capture import registry
from rclc_graph import ModelPool, plan_file, run_plan
from rclc_graph.executors.vllm_engine import shutdown
from tests.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

RUNS = 8
BRIDGES = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Hazel", "Willow"]
FOUNDERS = ["Ada Holm", "Bo Lind", "Cai Moreau", "Dita Shah", "Eli Park", "Fay Okafor", "Gus Rossi", "Hana Ito"]


def plans():
    built = []
    for index in range(RUNS):
        bridge, founder, year = BRIDGES[index], FOUNDERS[(index * 3) % len(FOUNDERS)], 1900 + index
        plan = plan_file(ROOT / "topologies" / "fanout_qa.yaml", {
            "question": f"Who founded the company that built the {bridge} bridge?",
            "documents": [
                f"The {bridge} bridge was built in {year + 29} by the Holm Steel Company.",
                f"Holm Steel Company was founded by {founder} in {year} in a small workshop.",
                f"The bridge was repainted in {year + 76} and again in 2010.",
            ],
        })
        nodes = tuple(dataclasses.replace(
            node,
            model=node.model.model_copy(update={"backend": "vllm"}),
            agent=node.agent.model_copy(update={"max_new_tokens": 12}) if node.output else node.agent,
        ) for node in plan.nodes)
        built.append(dataclasses.replace(plan, nodes=nodes))
    return built


@pytest.fixture(scope="module")
def pool():
    pool = ModelPool()
    yield pool
    for loaded in pool.loaded():
        shutdown(loaded)


def test_concurrent_fanout_runs_share_the_engine_and_answer_as_sequential_ones(pool):
    runs = plans()
    llm = pool.get(runs[0].models()[0]).model
    anyio.run(lambda: run_plan(runs[0], pool=pool))  # warm-up

    async def sequential():
        return [await run_plan(plan, pool=pool) for plan in runs]

    async def concurrent():
        results = [None] * RUNS
        async with anyio.create_task_group() as group:
            for index, plan in enumerate(runs):
                async def one(index=index, plan=plan):
                    results[index] = await run_plan(plan, pool=pool)
                group.start_soon(one)
        return results

    began = time.perf_counter()
    reference = anyio.run(sequential)
    sequential_seconds = time.perf_counter() - began
    before = dict(rclc.batching_report(llm)["batch_sizes"])
    began = time.perf_counter()
    results = anyio.run(concurrent)
    concurrent_seconds = time.perf_counter() - began
    assert all(result.status == "finished" for result in reference + results)
    assert [result.outputs for result in results] == [result.outputs for result in reference]
    after = rclc.batching_report(llm)["batch_sizes"]
    grown = {int(size): count - before.get(size, 0) for size, count in after.items()}
    assert max(size for size, count in grown.items() if count > 0) > 1
    assert registry.entries() == {} and not llm.llm_engine.has_unfinished_requests()
    print(f"\nvLLM, {RUNS} fanout_qa runs: sequential {sequential_seconds:.1f} s, concurrent {concurrent_seconds:.1f} s, "
          f"runs/minute ratio {sequential_seconds / concurrent_seconds:.2f}; engine steps per requests in the engine: "
          f"{dict(sorted((size, count) for size, count in grown.items() if count))}")
