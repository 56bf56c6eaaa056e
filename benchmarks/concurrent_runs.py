"""Throughput: N runs one after another vs the same N runs at once, on one embedded model.

Two workloads, each with N different inputs (a run that read another run's state would
answer differently), on the embedded SmolLM2-135M, fp32 on CPU, greedy, one `ModelPool`:

- `fanout_qa`: topologies/fanout_qa.yaml as shipped (three readers hand r4-selected state
  to one answerer, which generates 32 tokens): prefill- and selection-heavy;
- `chain_notes`: topologies/chain_of_agents.yaml under the experiments' text arm
  `text:max_new_tokens=64` (four readers each write a note of up to 64 tokens that the
  next one reads as text, then the answerer's 32): decode-heavy.

For each workload, side by side in this process:

1. sequential: the N runs one after another (`run_plan`, one at a time);
2. concurrent: the N runs started at once in one event loop, each with its own bounded
   `EventStream` read by a deliberately slow consumer (it reads nothing until its run waits
   for room, then takes `--consumer-ms` per event), so backpressure is exercised while the
   runs share the model's batches.

Reported per workload: wall seconds (median over `--repeats`, the phases alternating),
the process's CPU seconds, runs per minute and generated tokens per second of each phase
and their ratio, the decode batch-size histogram of each phase (`rclc.batching_report`:
decode steps per batch size), peak RSS (`PeakRss`: the kernel's high-water mark of the
phase where Linux allows its reset, else sampled every 10 ms; `peak_rss_method` says
which), and whether the concurrent outputs equal the sequential ones. Where a greedy token
differs, the engine's trace gives the top-2 logit margin at the first differing token of
every sequence whose prompt both phases decoded: a margin below 1e-4 is a float32 near-tie
that batched arithmetic may break either way. `concurrent_cores_busy` is the concurrent
phase's CPU seconds over its wall seconds, and `ratio_if_every_core_busy` the ratio it would
reach with its CPU seconds spread over every usable core (`core_bound`): what better
scheduling alone could give.

Torch runs with `--threads` intra-op threads (default 1: the runs' parallelism is what is
measured, and two runs' forwards share this machine's 2 cores). The machine is shared, so
compare the ratio measured in one process, not absolute times across runs.

With `--backend vllm` the same comparison runs on the embedded model served by an
in-process vLLM engine (from the vLLM environment, `make vllm`): every agent's requests go
through the engine's submission loop, and the histogram counts engine steps per number of
requests in the engine (no near-tie trace: vLLM's kernels are its own).

Run: python benchmarks/concurrent_runs.py [--runs 32] [--workloads fanout_qa,chain_notes]
     [--repeats 1] [--threads 1] [--max-batch 32] [--wait-ms MS] [--prefill-first-ms MS] [--worker-forwards N]
     [--max-new-tokens N] [--backend hf|vllm] [--dump records.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rclc  # noqa: E402
from rclc._flat_combining import usable_cores  # noqa: E402
from rclc_graph import EventStream, ModelPool, compile_plan, plan_file, run_plan  # noqa: E402
from rclc_graph.experiments.arm_graphs import apply_arm  # noqa: E402
from rclc_graph.experiments.arms import parse_arm  # noqa: E402
from rclc_graph.spec.load import read_graph  # noqa: E402

from peak_rss import PeakRss  # noqa: E402

FOUNDERS = ["Ada Holm", "Bo Lind", "Cai Moreau", "Dita Shah", "Eli Park", "Fay Okafor", "Gus Rossi", "Hana Ito"]
BRIDGES = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Hazel", "Willow"]
SIDES = ["North", "South", "East", "West"]
NAMES = ["Mara", "Ivo", "Lena", "Tomas", "Ruth", "Oskar", "Nadia", "Felix"]
CITIES = ["Velden", "Arnhal", "Brisk", "Corvo", "Dunmere", "Esk", "Farrow", "Galen"]


def fanout_inputs(count: int) -> list[dict[str, Any]]:
    """`count` inputs shaped like examples/inputs/fanout_qa.json, each its own bridge and founder."""
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


def chain_inputs(count: int) -> list[dict[str, Any]]:
    """`count` inputs shaped like examples/inputs/chain_of_agents.json, each its own person and city."""
    inputs = []
    for index in range(count):
        name, city = NAMES[index % len(NAMES)], CITIES[(index * 3 + index // len(NAMES)) % len(CITIES)]
        inputs.append({
            "question": f"Which city did {name} move to after the harbour closed?",
            "chunks": [
                f"{name} grew up in a fishing town on the north coast. Their father repaired nets in the harbour.",
                f"When {name} was {18 + index % 9} the harbour closed. Most families left within a year.",
                f"{name} packed two bags and took the night train south to {city}, where an aunt ran a bakery.",
                f"In {city} {name} learned to bake bread and, ten years later, opened a shop.",
            ],
        })
    return inputs


def fanout_plans(count: int, max_new_tokens: int | None) -> list[Any]:
    return _capped([plan_file(ROOT / "topologies" / "fanout_qa.yaml", inputs) for inputs in fanout_inputs(count)],
                   max_new_tokens)


def chain_plans(count: int, max_new_tokens: int | None, notes_tokens: int) -> list[Any]:
    topology = ROOT / "topologies" / "chain_of_agents.yaml"
    spec = apply_arm(read_graph(topology).spec, parse_arm(f"notes=text:max_new_tokens={notes_tokens}"))
    return _capped([compile_plan(spec, inputs) for inputs in chain_inputs(count)], max_new_tokens)


def _capped(plans: list[Any], max_new_tokens: int | None) -> list[Any]:
    """The answering nodes' `max_new_tokens` overridden (to shorten a smoke run)."""
    if max_new_tokens is None:
        return plans
    capped = []
    for plan in plans:
        nodes = tuple(
            dataclasses.replace(node, agent=node.agent.model_copy(update={"max_new_tokens": max_new_tokens}))
            if node.output else node
            for node in plan.nodes
        )
        capped.append(dataclasses.replace(plan, nodes=nodes))
    return capped


def on_backend(plans: list[Any], backend: str) -> list[Any]:
    """The plans with every node's model served by `backend`."""
    if backend == "hf":
        return plans
    return [
        dataclasses.replace(plan, nodes=tuple(
            dataclasses.replace(node, model=node.model.model_copy(update={"backend": backend})) for node in plan.nodes
        ))
        for plan in plans
    ]


async def sequential(plans: list[Any], pool: ModelPool) -> list[Any]:
    results = []
    for plan in plans:
        result = await run_plan(plan, pool=pool)
        assert result.status == "finished", result.error
        results.append(result)
    return results


async def concurrent(plans: list[Any], pool: ModelPool, *, max_events: int, max_bytes: int,
                     consumer_seconds: float) -> tuple[list[Any], list[Any]]:
    """All runs at once on the one pool; each run's events go to its own bounded stream that
    a slow consumer reads."""
    results: list[Any] = [None] * len(plans)
    streams = [EventStream(max_events=max_events, max_bytes=max_bytes) for _ in plans]
    finished = [False] * len(plans)

    async def consume(index: int) -> None:
        stream = streams[index]
        while stream.stats().blocked_publishes == 0 and not finished[index]:  # until the run waits for room
            await anyio.sleep(0.02)
        async for _ in stream:
            await anyio.sleep(consumer_seconds)

    async def one(index: int) -> None:
        try:
            result = await run_plan(plans[index], pool=pool, events=streams[index])
        finally:
            finished[index] = True
            streams[index].close()
        assert result.status == "finished", result.error
        results[index] = result

    async with anyio.create_task_group() as group:
        for index in range(len(plans)):
            group.start_soon(consume, index)
            group.start_soon(one, index)
    return results, [stream.stats() for stream in streams]


def core_bound(sequential_seconds: float, concurrent_cpu_seconds: float, cores: int) -> dict[str, float]:
    """How far scheduling alone could lift the ratio: the runs-per-minute ratio the concurrent
    phase would reach if its measured CPU seconds kept every usable core busy from start to
    end (`ratio_if_every_core_busy`). Why: on a CPU-bound machine a ratio short of a target
    is either idle cores (a scheduling matter) or CPU the concurrent work costs (a matter of
    what is computed); this tells them apart. A concurrent phase can beat it only by
    computing less than it did (larger decode batches, fewer forwarded rows)."""
    floor = concurrent_cpu_seconds / cores
    return {"usable_cores": cores, "ratio_if_every_core_busy": round(sequential_seconds / floor, 2) if floor > 0 else 0.0}


def cpu_seconds() -> float:
    """CPU time this process has used (all threads): with other jobs on the machine, wall
    time depends on them, CPU time much less."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def generated_tokens(results: list[Any]) -> int:
    return sum(node.generated_tokens for result in results for node in result.nodes.values())


def histogram_since(model: Any, before: dict[str, int]) -> dict[str, int]:
    after = rclc.batching_report(model)["batch_sizes"]
    grown = {size: count - before.get(size, 0) for size, count in after.items()}
    return {size: count for size, count in sorted(grown.items(), key=lambda item: int(item[0])) if count}


def near_ties(sequential_trace: list[Any], concurrent_trace: list[Any]) -> list[dict[str, Any]]:
    """Sequences both phases decoded from the same prompt whose greedy tokens differ: where,
    and the top-2 logit margins there (sequential, concurrent)."""
    alone = {entry.prompt: entry for entry in sequential_trace}
    found = []
    for entry in concurrent_trace:
        reference = alone.get(entry.prompt)
        if reference is None or reference.tokens == entry.tokens:
            continue
        index = next((i for i, (a, b) in enumerate(zip(reference.tokens, entry.tokens)) if a != b),
                     min(len(reference.tokens), len(entry.tokens)))
        found.append({
            "first_differing_token": index,
            "margin_sequential": reference.margins[index] if index < len(reference.margins) else None,
            "margin_concurrent": entry.margins[index] if index < len(entry.margins) else None,
        })
    return found


class _NoTrace:
    """Stands in for the HF engine's trace on vLLM (its kernels are its own)."""

    def tracing(self) -> Any:
        return contextlib.nullcontext([])


def untimed(record: Any) -> Any:
    """A run record without what differs between two runs of the same work (times, ids)."""
    if isinstance(record, dict):
        return {key: untimed(value) for key, value in record.items() if key not in ("seconds", "run_id")
                and not key.endswith(("_seconds", "_at"))}
    if isinstance(record, list):
        return [untimed(value) for value in record]
    return record


records: dict[str, list[Any]] = {}  # workload -> its sequential runs' records (for --dump)


def measure(name: str, plans: list[Any], pool: ModelPool, args: argparse.Namespace) -> dict[str, Any]:
    from rclc.backends.hf_batching import engine_for  # the engine's trace is a diagnostic, not public API

    model = pool.get(plans[0].models()[0]).model
    engine = engine_for(model) if args.backend == "hf" else _NoTrace()
    anyio.run(sequential, plans[:1], pool)  # warm-up
    seq_times, conc_times, seq_tokens, conc_tokens, seq_cpu, conc_cpu = [], [], [], [], [], []
    seq_peak = conc_peak = 0
    rss_methods: set[str] = set()
    identical = True
    ties: list[dict[str, Any]] = []
    high_events = blocked = 0
    for _ in range(args.repeats):
        before = dict(rclc.batching_report(model)["batch_sizes"])
        with PeakRss() as sampler, engine.tracing() as seq_trace:
            began, cpu = time.perf_counter(), cpu_seconds()
            reference = anyio.run(sequential, plans, pool)
            seq_times.append(time.perf_counter() - began)
            seq_cpu.append(cpu_seconds() - cpu)
        seq_peak = max(seq_peak, sampler.peak)
        rss_methods.add(sampler.method)
        seq_histogram = histogram_since(model, before)
        seq_tokens.append(generated_tokens(reference))
        records.setdefault(name, [untimed(result.to_dict()) for result in reference])
        before = dict(rclc.batching_report(model)["batch_sizes"])
        with PeakRss() as sampler, engine.tracing() as conc_trace:
            began, cpu = time.perf_counter(), cpu_seconds()
            results, stats = anyio.run(
                lambda: concurrent(plans, pool, max_events=args.max_events, max_bytes=args.max_bytes,
                                   consumer_seconds=args.consumer_ms / 1000)
            )
            conc_times.append(time.perf_counter() - began)
            conc_cpu.append(cpu_seconds() - cpu)
        conc_peak = max(conc_peak, sampler.peak)
        rss_methods.add(sampler.method)
        conc_histogram = histogram_since(model, before)
        conc_tokens.append(generated_tokens(results))
        same = [a.outputs == b.outputs for a, b in zip(reference, results)]
        identical = identical and all(same)
        ties += near_ties(seq_trace, conc_trace)
        high_events = max(high_events, max(stat.high_water_events for stat in stats))
        blocked += sum(stat.blocked_publishes for stat in stats)
    seq, conc = statistics.median(seq_times), statistics.median(conc_times)
    conc_cpu_median = statistics.median(conc_cpu)
    runs = len(plans)
    mib = 1 << 20
    decoded = sum(int(size) * count for size, count in conc_histogram.items())
    steps = sum(conc_histogram.values())
    return {
        "workload": name,
        "runs": runs,
        "sequential_seconds": round(seq, 2),
        "concurrent_seconds": round(conc, 2),
        "sequential_runs_per_minute": round(60 * runs / seq, 2),
        "concurrent_runs_per_minute": round(60 * runs / conc, 2),
        "runs_per_minute_ratio": round(seq / conc, 2),
        "sequential_cpu_seconds": round(statistics.median(seq_cpu), 2),
        "concurrent_cpu_seconds": round(conc_cpu_median, 2),
        "concurrent_cores_busy": round(conc_cpu_median / conc, 2),
        **core_bound(seq, conc_cpu_median, usable_cores()),
        "sequential_seconds_each_repeat": [round(value, 2) for value in seq_times],
        "concurrent_seconds_each_repeat": [round(value, 2) for value in conc_times],
        "sequential_tokens_per_second": round(statistics.median(seq_tokens) / seq, 2),
        "concurrent_tokens_per_second": round(statistics.median(conc_tokens) / conc, 2),
        "generated_tokens_per_phase": statistics.median(conc_tokens),
        "batch_sizes_sequential": seq_histogram,
        "batch_sizes_concurrent": conc_histogram,
        "mean_batch_concurrent": round(decoded / steps, 2) if steps else 0.0,
        "identical_outputs": identical,
        "differing_runs": sum(1 for a, b in zip(reference, results) if a.outputs != b.outputs),
        "near_ties": ties,
        "distinct_outputs": len({json.dumps(result.outputs, sort_keys=True) for result in reference}),
        "outputs_sample": [next(iter(result.outputs.values()), "") for result in reference[:3]],
        "peak_rss_sequential_mib": round(seq_peak / mib, 1),
        "peak_rss_concurrent_mib": round(conc_peak / mib, 1),
        "peak_rss_method": ",".join(sorted(rss_methods)),
        "stream_high_water_events": high_events,
        "blocked_publishes": blocked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--workloads", default="fanout_qa,chain_notes")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--wait-ms", type=float, default=None, help="rclc.Batching.wait_ms (default: rclc's)")
    parser.add_argument("--prefill-first-ms", type=float, default=None,
                        help="rclc.Batching.prefill_first_ms (default: rclc's; 0: decode steps never wait for prefills)")
    parser.add_argument("--worker-forwards", type=int, default=None,
                        help="rclc.Batching.worker_forwards: worker-side forwards at once per model (default: rclc's)")
    parser.add_argument("--capture-batch", type=int, default=None,
                        help="rclc.Batching.capture_batch (default: rclc's; 1: each transfer's captures alone)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the answering node's max_new_tokens")
    parser.add_argument("--notes-tokens", type=int, default=64, help="chain_notes: each reader's note length cap")
    parser.add_argument("--max-events", type=int, default=4)
    parser.add_argument("--max-bytes", type=int, default=4096)
    parser.add_argument("--consumer-ms", type=float, default=20.0)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write the sequential runs' records (timings left out) here, to compare two trees with cmp")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    pool = ModelPool()
    pool.set_max_batch(args.max_batch)
    builders = {
        "fanout_qa": lambda: on_backend(fanout_plans(args.runs, args.max_new_tokens), args.backend),
        "chain_notes": lambda: on_backend(chain_plans(args.runs, args.max_new_tokens, args.notes_tokens), args.backend),
    }
    workloads = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = sorted(set(workloads) - set(builders))
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; choose from {sorted(builders)}")
    results = []
    for name in workloads:
        plans = builders[name]()
        model = pool.get(plans[0].models()[0]).model
        if args.wait_ms is not None:
            rclc.configure_batching(model, wait_ms=args.wait_ms)
        if args.prefill_first_ms is not None:
            rclc.configure_batching(model, prefill_first_ms=args.prefill_first_ms)
        if args.worker_forwards is not None:
            rclc.configure_batching(model, worker_forwards=args.worker_forwards)
        if args.capture_batch is not None:
            rclc.configure_batching(model, capture_batch=args.capture_batch)
        results.append(measure(name, plans, pool, args))
    if args.dump is not None:
        args.dump.write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
    model = pool.loaded()[0].model
    if args.backend == "vllm":
        from rclc_graph.executors.vllm_engine import shutdown  # only vLLM runs need it

        report = rclc.batching_report(model)
        shutdown(pool.loaded()[0])
    else:
        report = rclc.batching_report(model)
    print(json.dumps({
        "benchmark": "concurrent_runs",
        "model": "embedded (SmolLM2-135M-Instruct, float32)",
        "backend": args.backend,
        "runs": args.runs,
        "repeats": args.repeats,
        "batching": report | {"batch_sizes": "per workload below"},
        "answer_max_new_tokens_overridden": args.max_new_tokens,
        "notes_tokens": args.notes_tokens,
        "consumer_ms_per_event": args.consumer_ms,
        "stream_bounds": {"max_events": args.max_events, "max_bytes": args.max_bytes},
        "workloads": results,
        "peak_rss_process_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
