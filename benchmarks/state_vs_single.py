"""What a state hop costs per case, side by side with one agent reading everything (issue 28).

The held-out fan-out of docs/experiments.md (`rclc-graph data make --seed 10 --documents 3`,
made in-process by the same generator): per case, topologies/fanout_qa.yaml as shipped (three
readers hand r4 state, selected for the question, to the answerer) and the experiments'
`single_context` arm (one agent reads the three documents, then the question), one run
after the other, the order alternating by case, on one embedded model in one process. Each
run is timed end to end (the run's own wall clock, as the experiments' `latency_s`); the
report gives the medians over cases, their ratio (target: at most 1.5) and the median of the
per-case ratios, plus the seconds of each step of the state arm (the readers, the hop's
selection, the answerer) and how many answers the two arms share.

Run: python benchmarks/state_vs_single.py [--cases 20] [--seed 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rclc  # noqa: E402
from rclc_graph import ModelPool, compile_plan, run_plan  # noqa: E402
from rclc_graph.experiments.arm_graphs import apply_arm  # noqa: E402
from rclc_graph.experiments.arms import parse_arm  # noqa: E402
from rclc_graph.experiments.inputs import resolve_mapping  # noqa: E402
from rclc_graph.experiments.synthetic import make_dataset  # noqa: E402
from rclc_graph.spec.load import read_graph  # noqa: E402

TARGET_RATIO = 1.5


def arm_specs() -> dict[str, Any]:
    """The state arm (the topology as shipped) and the single-context reference."""
    spec = read_graph(ROOT / "topologies" / "fanout_qa.yaml").spec
    return {"state_r4": spec, "single": apply_arm(spec, parse_arm("single=single_context"))}


def timed(plan: Any, pool: ModelPool) -> tuple[Any, float]:
    began = time.perf_counter()
    result = anyio.run(lambda: run_plan(plan, pool=pool))
    seconds = time.perf_counter() - began
    if result.status != "finished":
        raise RuntimeError(f"run failed: {result.error}")
    return result, seconds


def state_steps(result: Any) -> dict[str, float]:
    readers = [node for name, node in result.nodes.items() if name != "final"]
    final = result.nodes["final"]
    return {
        "readers_s": max(node.finished_at for node in readers) - min(node.started_at for node in readers),
        # The hops of one delivery (a fan-in's senders, selected together) each carry that
        # delivery's seconds: count each delivery once, not once per hop.
        "selection_s": sum(seconds for _, seconds in {(hop.target, hop.selection_seconds) for hop in result.hops}),
        "answerer_s": final.finished_at - final.started_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=10, help="dataset seed (10: the held-out fan-out)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    specs = arm_specs()
    mapping = resolve_mapping(specs["state_r4"])
    cases = make_dataset(args.cases, seed=args.seed, documents=3)
    pool = ModelPool()
    load_before = os.getloadavg()
    warm = mapping.inputs(cases[0])
    for spec in specs.values():  # warm-up: the model, lazy imports, first-call costs
        timed(compile_plan(spec, warm), pool)
    seconds: dict[str, list[float]] = {name: [] for name in specs}
    # What each arm generated, and how long its generation took: the arms answer differently,
    # and a longer answer costs decode steps that have nothing to do with the handoff.
    tokens: dict[str, list[int]] = {name: [] for name in specs}
    generation: dict[str, list[float]] = {name: [] for name in specs}
    steps: list[dict[str, float]] = []
    same = 0
    for index, case in enumerate(cases):
        inputs = mapping.inputs(case)
        names = list(specs) if index % 2 == 0 else list(reversed(specs))
        answers = {}
        for name in names:
            result, wall = timed(compile_plan(specs[name], inputs), pool)
            seconds[name].append(wall)
            tokens[name].append(sum(node.generated_tokens for node in result.nodes.values()))
            generation[name].append(sum(node.generation_seconds for node in result.nodes.values()))
            answers[name] = next(iter(result.outputs.values()), "")
            if name == "state_r4":
                steps.append(state_steps(result))
        same += answers["state_r4"].strip() == answers["single"].strip()
    state, single = statistics.median(seconds["state_r4"]), statistics.median(seconds["single"])
    ratio = state / single
    report = rclc.batching_report(pool.loaded()[0].model)
    print(json.dumps({
        "benchmark": "state_vs_single",
        "data": f"make_dataset({args.cases}, seed={args.seed}, documents=3)",
        "cases": args.cases,
        "state_r4_median_s": round(state, 3),
        "single_median_s": round(single, 3),
        "ratio_of_medians": round(ratio, 3),
        "median_of_case_ratios": round(statistics.median(a / b for a, b in zip(seconds["state_r4"], seconds["single"])), 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "state_steps_median_s": {key: round(statistics.median(step[key] for step in steps), 3) for key in steps[0]},
        "same_answer": same,
        "generated_tokens_median": {name: statistics.median(values) for name, values in tokens.items()},
        "generation_s_median": {name: round(statistics.median(values), 3) for name, values in generation.items()},
        "each_s": {name: [round(value, 3) for value in values] for name, values in seconds.items()},
        "prompt_prefills": report.get("prompt_prefills"),
        "engine_prefill_batches": report.get("prefill_batches"),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }, indent=2))


if __name__ == "__main__":
    main()
