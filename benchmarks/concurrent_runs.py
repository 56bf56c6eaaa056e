"""Load: N concurrent runs of topologies/fanout_qa.yaml in one process on one embedded model.

Workload: the shipped fan-out topology (three readers hand compressed state to one answerer)
on the embedded SmolLM2-135M, fp32 on CPU, greedy, one `ModelPool` shared by every run. The N
runs get N different inputs (the example's question and documents with the bridge, the founder
and the years varied per run), so a run that read another run's state would answer differently.

1. sequential: the N runs one after another (`run_plan`, one at a time);
2. concurrent: the N runs started at once in one event loop, each with its own bounded
   `EventStream` read by a deliberately slow consumer (reads nothing until its run waits for room,
   then takes `--consumer-ms` per event), so
   backpressure is exercised while the runs share the model.

Reported: wall seconds of each phase (median over `--repeats`), their ratio, whether the N
concurrent answers equal the N sequential ones, peak RSS (sampled every 10 ms from
/proc/self/statm, per phase, and the process peak from getrusage), the streams' high-water
marks against their bounds, and whether any run's agents outlived it.

This machine has 2 CPU cores shared with other jobs: concurrency cannot speed up compute here
(the model's forwards take the cores either way); what it shows is that N runs interleave on
one model without deadlock, crosstalk or unbounded memory.

Run: python benchmarks/concurrent_runs.py [--runs 32] [--repeats 1] [--max-new-tokens N]
(`--max-new-tokens` overrides the answerer's 32 to shorten the benchmark; the JSON says so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rclc_graph import EventStream, ModelPool, plan_file, run_plan  # noqa: E402

TOPOLOGY = ROOT / "topologies" / "fanout_qa.yaml"
FOUNDERS = ["Ada Holm", "Bo Lind", "Cai Moreau", "Dita Shah", "Eli Park", "Fay Okafor", "Gus Rossi", "Hana Ito"]
BRIDGES = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Hazel", "Willow"]
SIDES = ["North", "South", "East", "West"]


def run_inputs(count: int) -> list[dict[str, Any]]:
    """`count` different inputs shaped like examples/inputs/fanout_qa.json (up to 32 distinct
    bridges, each with its own founder and years)."""
    inputs = []
    for index in range(count):
        bridge = f"{SIDES[index // len(BRIDGES) % len(SIDES)]} {BRIDGES[index % len(BRIDGES)]}"
        founder, year = FOUNDERS[(index * 3) % len(FOUNDERS)], 1900 + index
        inputs.append({
            "question": f"Who founded the company that built the {bridge} bridge?",
            "documents": [
                f"The {bridge} bridge was built in {year + 29} by the Holm Steel Company.",
                f"Holm Steel Company was founded by {founder} in {year} in a small workshop.",
                f"The bridge was repainted in {year + 76} and again in 2010.",
            ],
        })
    return inputs


def plans(count: int, max_new_tokens: int | None) -> list[Any]:
    built = [plan_file(TOPOLOGY, inputs) for inputs in run_inputs(count)]
    if max_new_tokens is None:
        return built
    import dataclasses

    shortened = []
    for plan in built:
        nodes = tuple(dataclasses.replace(node, agent=node.agent.model_copy(update={"max_new_tokens": max_new_tokens}))
                      for node in plan.nodes)
        shortened.append(dataclasses.replace(plan, nodes=nodes))
    return shortened


class RssSampler:
    """Peak resident set size of this process over a phase, sampled every 10 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def current() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            self._stop.wait(0.01)

    def __enter__(self) -> RssSampler:
        self.peak = self.current()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


async def sequential(all_plans: list[Any], pool: ModelPool) -> list[dict[str, str]]:
    outputs = []
    for plan in all_plans:
        result = await run_plan(plan, pool=pool)
        assert result.status == "finished", result.error
        outputs.append(result.outputs)
    return outputs


async def concurrent(all_plans: list[Any], pool: ModelPool, *, max_events: int, max_bytes: int,
                     consumer_seconds: float) -> tuple[list[dict[str, str]], list[Any]]:
    """All runs at once on the one pool (each run its own LocalExecutor, as `run_plan` makes
    by default); each run's events go to its own bounded stream that a slow consumer reads."""
    outputs: list[dict[str, str] | None] = [None] * len(all_plans)
    streams = [EventStream(max_events=max_events, max_bytes=max_bytes) for _ in all_plans]

    finished = [False] * len(all_plans)

    async def consume(index: int) -> None:
        stream = streams[index]
        while stream.stats().blocked_publishes == 0 and not finished[index]:  # until the run waits for room
            await anyio.sleep(0.02)
        async for _ in stream:
            await anyio.sleep(consumer_seconds)

    async def one(index: int) -> None:
        try:
            result = await run_plan(all_plans[index], pool=pool, events=streams[index])
        finally:
            finished[index] = True
            streams[index].close()
        assert result.status == "finished", result.error
        outputs[index] = result.outputs

    async with anyio.create_task_group() as group:
        for index in range(len(streams)):
            group.start_soon(consume, index)
            group.start_soon(one, index)
    return [output or {} for output in outputs], [stream.stats() for stream in streams]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the answerer's max_new_tokens")
    parser.add_argument("--max-events", type=int, default=4)
    parser.add_argument("--max-bytes", type=int, default=4096)
    parser.add_argument("--consumer-ms", type=float, default=20.0)
    args = parser.parse_args()

    import torch

    all_plans = plans(args.runs, args.max_new_tokens)
    pool = ModelPool()
    pool.get(all_plans[0].models()[0], TOPOLOGY.parent)
    anyio.run(sequential, all_plans[:1], pool)  # warm-up
    baseline = RssSampler.current()
    sequential_seconds, concurrent_seconds, identical = [], [], True
    sequential_peak = concurrent_peak = 0
    high_events = high_bytes = blocked = 0
    for _ in range(args.repeats):
        with RssSampler() as sampler:
            began = time.perf_counter()
            reference = anyio.run(sequential, all_plans, pool)
            sequential_seconds.append(time.perf_counter() - began)
        sequential_peak = max(sequential_peak, sampler.peak)
        with RssSampler() as sampler:
            began = time.perf_counter()
            outputs, stats = anyio.run(
                lambda: concurrent(all_plans, pool, max_events=args.max_events, max_bytes=args.max_bytes,
                                   consumer_seconds=args.consumer_ms / 1000)
            )
            concurrent_seconds.append(time.perf_counter() - began)
        concurrent_peak = max(concurrent_peak, sampler.peak)
        identical = identical and outputs == reference
        high_events = max(high_events, max(stat.high_water_events for stat in stats))
        high_bytes = max(high_bytes, max(stat.high_water_bytes for stat in stats))
        blocked += sum(stat.blocked_publishes for stat in stats)
    mib = 1 << 20
    seq, conc = statistics.median(sequential_seconds), statistics.median(concurrent_seconds)
    print(json.dumps({
        "benchmark": "concurrent_runs",
        "topology": "topologies/fanout_qa.yaml",
        "model": all_plans[0].models()[0].source,
        "runs": args.runs,
        "concurrency": args.runs,
        "repeats": args.repeats,
        "answerer_max_new_tokens": args.max_new_tokens or all_plans[0].node("final").agent.max_new_tokens,
        "max_new_tokens_overridden": args.max_new_tokens is not None,
        "sequential_seconds_median": round(seq, 2),
        "concurrent_seconds_median": round(conc, 2),
        "concurrent_over_sequential": round(conc / seq, 3),
        "identical_answers": identical,
        "distinct_answers": len({json.dumps(output, sort_keys=True) for output in reference}),
        "answers_sample": [output.get("final", "") for output in reference[:4]],
        "rss_after_warmup_mib": round(baseline / mib, 1),
        "peak_rss_sequential_mib": round(sequential_peak / mib, 1),
        "peak_rss_concurrent_mib": round(concurrent_peak / mib, 1),
        "peak_rss_process_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "stream_bounds": {"max_events": args.max_events, "max_bytes": args.max_bytes},
        "stream_high_water": {"events": high_events, "bytes": high_bytes},
        "blocked_publishes": blocked,
        "consumer_ms_per_event": args.consumer_ms,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }, indent=2))


if __name__ == "__main__":
    main()
