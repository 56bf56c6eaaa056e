"""Scale-out: runs per minute on the Ray executor with 1 and 2 replicas, next to the local one.

Workload: topologies/fanout_qa.yaml (three readers hand compressed state to one answerer, 32
generated tokens) on the embedded SmolLM2-135M, fp32 on CPU, with the example inputs. For each
executor and each concurrency c in 1, 2, 4, `--batches` batches of c concurrent runs are timed
after one warm-up run; runs per minute = runs / wall time * 60.

- local: LocalExecutor, one process, one shared model (runs interleave on the core's locks).
- ray, 1 or 2 replicas: a simulated cluster (ray.cluster_utils.Cluster) of two nodes of one
  CPU each on this machine; each replica is an actor holding one CPU and its own model copy.
  By default a run stays on one replica and concurrent runs spread over replicas.

Then one run with the answerer pinned to the other replica measures what crossed machines per
hop: the selected payload (bytes in Ray's object store) next to the sender's uncompressed state
(all its input rows, and its KV cache, which a KV-shipping design would move).

This machine has 2 CPU cores: the local executor's torch uses both; each Ray actor gets one CPU
and one torch thread, and the driver shares the same cores, so scaling past 2 replicas cannot
show here. The JSON says so.

Run: python benchmarks/scale_out.py [--batches 2] [--concurrency 1 2 4]
(needs the ray extra: pip install -e ".[ray]").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rclc_graph import plan_file, run_plan  # noqa: E402
from rclc_graph.executors import LocalExecutor, ModelPool  # noqa: E402

TOPOLOGY = ROOT / "topologies" / "fanout_qa.yaml"
INPUTS = ROOT / "examples" / "inputs" / "fanout_qa.json"


async def timed_batches(plan: Any, executor: Any, concurrency: int, batches: int) -> tuple[float, int, list[Any]]:
    """Wall seconds for `batches` batches of `concurrency` concurrent runs; (seconds, runs, results)."""
    results: list[Any] = []
    began = time.perf_counter()
    for _ in range(batches):
        async with anyio.create_task_group() as group:
            for _ in range(concurrency):
                group.start_soon(_one, plan, executor, results)
    return time.perf_counter() - began, batches * concurrency, results


async def _one(plan: Any, executor: Any, results: list[Any]) -> None:
    result = await run_plan(plan, executor=executor)
    if result.status != "finished":
        raise RuntimeError(f"a benchmark run failed: {result.error}")
    executor.release(result.run_id)
    results.append(result)


def measure(plan: Any, executor: Any, levels: list[int], batches: int) -> dict[str, Any]:
    anyio.run(timed_batches, plan, executor, 1, 1)  # warm-up: models loaded, actors started
    figures: dict[str, Any] = {}
    outputs = set()
    for concurrency in levels:
        seconds, runs, results = anyio.run(timed_batches, plan, executor, concurrency, batches)
        outputs |= {json.dumps(result.outputs, sort_keys=True) for result in results}
        figures[str(concurrency)] = {"runs": runs, "seconds": round(seconds, 2),
                                     "runs_per_minute": round(runs / seconds * 60, 2)}
    figures["distinct_outputs"] = len(outputs)
    return figures


def state_bytes(model: Any, positions: int) -> dict[str, int]:
    """Uncompressed size of a sender state of `positions` rows: its input rows and its KV cache."""
    config = model.config
    element = next(model.parameters()).element_size()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * positions * element
    return {"input_rows_bytes": positions * config.hidden_size * element, "kv_cache_bytes": kv}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2, help="timed batches per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from rclc_graph.executors.ray import RayExecutor

    plan = plan_file(TOPOLOGY, json.loads(INPUTS.read_text()))
    pool = ModelPool()
    report: dict[str, Any] = {
        "benchmark": "scale_out",
        "topology": str(TOPOLOGY.relative_to(ROOT)),
        "model": "embedded SmolLM2-135M-Instruct, float32, CPU",
        "machine": {
            "cpu_cores": os.cpu_count(),
            "note": "2 CPU cores: the local executor's torch uses both; each Ray actor holds 1 CPU (1 torch thread) "
                    "and the driver shares the same cores, so scaling beyond 2 replicas cannot show on this machine",
        },
        "cluster": "ray.cluster_utils.Cluster: 2 nodes x 1 CPU on this machine (loopback); one actor per replica",
        "batches": args.batches,
        "runs_per_minute": {},
    }
    local = LocalExecutor(pool)
    report["runs_per_minute"]["local"] = measure(plan, local, args.concurrency, args.batches)
    model = pool.get(plan.models()[0], TOPOLOGY.parent).model

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    try:
        for replicas in (1, 2):
            with RayExecutor(replicas={"base": replicas}) as executor:
                anyio.run(executor.prepare, plan, TOPOLOGY.parent)
                key = f"ray_{replicas}_replica" + ("s" if replicas > 1 else "")
                report["runs_per_minute"][key] = measure(plan, executor, args.concurrency, args.batches)
        with RayExecutor(replicas={"base": 2}, pins={"final": 1}) as executor:  # the answerer on the other node
            anyio.run(executor.prepare, plan, TOPOLOGY.parent)
            crossing = anyio.run(lambda: run_plan(plan, executor=executor))
    finally:
        ray.shutdown()
        cluster.shutdown()
    hops = []
    for hop in crossing.hops:
        full = state_bytes(model, hop.total_positions)
        hops.append({
            "hop": f"{hop.source} -> {hop.target}",
            "transport": hop.placement["transport"],
            "sender_positions": hop.total_positions,
            "kept_positions": hop.kept_positions,
            "crossed_bytes": hop.crossed_bytes,
            **full,
            "crossed_vs_input_rows": round(hop.crossed_bytes / full["input_rows_bytes"], 3),
            "crossed_vs_kv_cache": round(hop.crossed_bytes / full["kv_cache_bytes"], 3),
        })
    report["bytes_per_hop"] = hops
    report["versions"] = {name: metadata.version(name) for name in ("ray", "torch", "transformers")}
    report["python"] = platform.python_version()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
