"""Model-free costs of the graph layer: planning, event streaming and lineage composition.

Prints one JSON object. Run: `python benchmarks/graph_core.py` (a few seconds on one core).
These are the per-run overheads the scheduler adds on top of model work, so they should stay
far below a single forward pass.
"""

from __future__ import annotations

import json
import random
import time
from functools import partial

import anyio

from rclc_graph import EventStream, Lineage, Policy, chain_of_agents, compose_hop, debate, fan_out, receiver_lineage


def best_of(repeats: int, action) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def planning() -> dict[str, float]:
    fan = fan_out(None)
    documents = [f"document {index}" for index in range(1000)]
    chain = chain_of_agents(64)
    chunks = [f"chunk {index}" for index in range(64)]
    talk = debate(4, 16, policy=Policy(mode="text"))
    return {
        "fanout_1000_docs_plan_ms": 1e3 * best_of(5, lambda: fan.plan({"question": "q", "documents": documents})),
        "chain_64_plan_ms": 1e3 * best_of(5, lambda: chain.plan({"question": "q", "chunks": chunks})),
        "debate_4x16_plan_ms": 1e3 * best_of(5, lambda: talk.plan({"question": "q"})),
    }


async def stream_throughput(producers: int, per_producer: int, max_events: int) -> dict[str, float]:
    stream = EventStream(max_events=max_events, max_bytes=1 << 20)
    epoch = stream.open_epoch()

    async def produce(number: int) -> None:
        for index in range(per_producer):
            await stream.publish("token", {"node": f"n{number}", "text": "tok", "i": index}, run_id="bench", epoch=epoch)

    received = 0
    start = time.perf_counter()
    async with anyio.create_task_group() as outer:

        async def consume() -> None:
            nonlocal received
            async for _event in stream:
                received += 1

        outer.start_soon(consume)
        async with anyio.create_task_group() as inner:
            for number in range(producers):
                inner.start_soon(partial(produce, number))
        stream.close()
    seconds = time.perf_counter() - start
    stats = stream.stats()
    return {
        "events": received,
        "events_per_second": received / seconds,
        "high_water_events": stats.high_water_events,
        "blocked_publishes": stats.blocked_publishes,
    }


def lineage_costs() -> dict[str, float]:
    rng = random.Random(0)
    inherited = Lineage()
    start = time.perf_counter()
    for hop in range(5):
        state = receiver_lineage(f"w{hop}", [inherited], 8192)
        kept = sorted(rng.sample(range(len(state)), len(state) // 4))
        inherited = compose_hop(state, kept, source=f"w{hop}", target=f"w{hop + 1}",
                                inherited_positions=len(state) - 8192, budget=len(kept)).lineage
    seconds = time.perf_counter() - start
    return {
        "five_hops_8192_new_rows_ms": 1e3 * seconds,
        "final_positions": len(inherited),
        "final_segments": len(inherited.segments),
        "record_json_bytes": len(json.dumps(inherited.to_dict())),
    }


def main() -> None:
    result = {"planning": planning()}
    result["events"] = {
        "4_producers_bounded_16": anyio.run(stream_throughput, 4, 5000, 16),
        "4_producers_bounded_1024": anyio.run(stream_throughput, 4, 5000, 1024),
    }
    result["lineage"] = lineage_costs()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
