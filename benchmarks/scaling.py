"""How cost grows with the work (issue 28): longer chains, wider fan-outs, longer documents,
under a relative (r4) and a bounded (b128) budget, on the embedded SmolLM2-135M.

Three sweeps, each over one size with everything else fixed:

- `chain`: chains of 4, 8, 16 and 32 readers (`rclc_graph.chain_of_agents`), each reading a
  256-token chunk and passing its state on, then a final answer;
- `fanout`: 4, 8, 16 and 32 readers in parallel (`rclc_graph.fan_out`), one 256-token
  document each, into one answering node;
- `document`: one reader of a 256 to 4,096-token document handing state to the answering node.

Every edge's selection is conditioned on the question (`request: "{question}"`, as in the
shipped topologies). The final node generates 4 tokens (decoding is measured elsewhere:
concurrent_runs.py).

Processes: each (sweep, size, budget) runs in a process of its own (`--one`), so a budget's
peak RSS is its own (memory a run freed stays with the process, so one process running r4
and b128 would report r4's high-water mark under b128 too). A process loads the model, runs
one small warm-up run, takes its baseline RSS, then runs the configuration `--repeats` times
and reports the median wall time, the peak RSS above the baseline (the highest of its
repeats, each listed; a repeat's peak is the kernel's high-water mark over the run,
`peak_rss.PeakRss`, where until 2026-12-06 it was sampled every 5 ms), and per hop the
payload bytes, the positions kept and the sender's positions, plus the seconds of each step
kind (the readers' nodes, the selections, the final node) and each reader's node seconds in
order. For one size the r4 and the b128 process run one right after the other (r4 first at
the first, third, ... size, b128 first at the others), so their medians are compared side
by side, one process each.

Fresh text: every repeat reads pieces no earlier run of its process read (the warm-up
included: each repeat, and the warm-up, cut their pieces from their own place in the
sentence stream), so no measured prompt comes from the model's prefix store
(`rclc._prefix_cache`, on as by default) beyond what runs share by construction: the chat
template and the question ahead of each piece. The store's figures of the measured runs
(`prompt_prefills`: positions reused from it and forwarded) are in the JSON to show it.
`--plot` draws the figures of docs/performance.md from the JSON files; the fitted log-log
slope of each curve says how the cost grows (1: linear in the size).

Run:
    python benchmarks/scaling.py --sweep chain --repeats 3 --json out/scaling_chain.json
    python benchmarks/scaling.py --sweep fanout --repeats 3 --json out/scaling_fanout.json
    python benchmarks/scaling.py --sweep document --repeats 3 --json out/scaling_document.json
    python benchmarks/scaling.py --plot out/scaling_chain.json out/scaling_fanout.json \\
        out/scaling_document.json --figures docs/img/scaling
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peak_rss import PeakRss, rss  # noqa: E402

SWEEPS = {
    "chain": [4, 8, 16, 32],
    "fanout": [4, 8, 16, 32],
    "document": [256, 512, 1024, 2048, 4096],
}
PIECE_TOKENS = 256  # a chain's chunk, a fan-out's document
BUDGETS = {"r4": {"ratio": 4}, "b128": {"budget": 128}}
ANSWER_TOKENS = 4
QUESTION = "Which project did the team based in Lisbon launch, and who owns it?"

_PEOPLE = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena"]
_CITIES = ["Oslo", "Lima", "Lisbon", "Nairobi", "Hanoi", "Quito", "Tallinn", "Perth", "Accra", "Porto"]
_THINGS = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Willow", "Hazel", "Juniper", "Larch"]


def document(tokenizer: Any, tokens: int, offset: int) -> str:
    """Report-like sentences (each piece its own, by `offset`), cut to `tokens` tokens."""
    sentences, index, ids = [], offset * 37, []
    while len(ids) < tokens:
        for _ in range(8):
            person, city = _PEOPLE[index % len(_PEOPLE)], _CITIES[(index * 7) % len(_CITIES)]
            thing = f"{_THINGS[(index * 3) % len(_THINGS)]}-{index}"
            sentences.append(f"The {thing} project was launched in {1990 + (index * 13) % 35} by a team based in "
                             f"{city}; {person} owns it and reports {index % 9 + 2} milestones each quarter.")
            index += 1
        ids = tokenizer(" ".join(sentences), add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids[:tokens])


FRESH_STRIDE = 1000
"""Pieces apart per repeat in the sentence stream (`document`'s `offset`): a piece reads 37
sentences after the previous piece, so repeats never share a sentence."""
WARM_UP_REPEAT = -1  # the warm-up run's pieces: their own place in the stream too


def piece_offset(repeat: int, index: int) -> int:
    """Where piece `index` of repeat `repeat` starts in the sentence stream (fresh per repeat)."""
    return FRESH_STRIDE * (repeat + 2) + index


def plan_for(sweep: str, size: int, budget: str, tokenizer: Any, repeat: int = 0) -> Any:
    from rclc_graph import Policy, chain_of_agents, fan_out

    policy = Policy(**BUDGETS[budget], request="{question}")  # as the shipped topologies ask
    if sweep == "chain":
        graph = chain_of_agents(size, policy=policy, max_new_tokens=ANSWER_TOKENS)
        return graph.plan({"question": QUESTION,
                           "chunks": [document(tokenizer, PIECE_TOKENS, piece_offset(repeat, index))
                                      for index in range(size)]})
    count, tokens = (size, PIECE_TOKENS) if sweep == "fanout" else (1, size)
    graph = fan_out(count, policy=policy, max_new_tokens=ANSWER_TOKENS)
    documents = [document(tokenizer, tokens, piece_offset(repeat, index)) for index in range(count)]
    return graph.plan({"question": QUESTION, "documents": documents})


def run_once(plan: Any, pool: Any) -> tuple[Any, float, PeakRss]:
    import anyio

    from rclc_graph import run_plan

    with PeakRss() as peak:
        began = time.perf_counter()
        result = anyio.run(lambda: run_plan(plan, pool=pool))
        seconds = time.perf_counter() - began
    if result.status != "finished":
        raise RuntimeError(f"the run did not finish: {result.status} {result.error}")
    return result, seconds, peak


def steps(result: Any) -> dict[str, Any]:
    """Seconds per step kind: the readers' nodes (prefill, plus the selection of the hops
    into them), the selections (summed over hops) and the final node (its hops' selection,
    its prefill and its 4 tokens); and each reader's node seconds in plan order."""
    readers = [node.finished_at - node.started_at for name, node in result.nodes.items() if name != "final"]
    final = result.nodes["final"]
    return {
        "readers_s": round(sum(readers), 3),
        "selection_s": round(sum(hop.selection_seconds for hop in result.hops), 3),
        "final_s": round(final.finished_at - final.started_at, 3),
        "each_reader_s": [round(seconds, 3) for seconds in readers],
    }


def prompt_prefills(model: Any) -> dict[str, int]:
    """The model's prompt-prefill counters so far (positions reused from the prefix store,
    positions forwarded, prompts)."""
    import rclc

    figures = rclc.batching_report(model).get("prompt_prefills") or {}
    return {key: int(figures.get(key, 0)) for key in ("prompts", "reused_positions", "forwarded_positions")}


def measure_one(sweep: str, size: int, budget: str, repeats: int, threads: int) -> dict[str, Any]:
    """One configuration (one budget) in this process, each repeat on fresh text."""
    import torch

    from rclc import models
    from rclc_graph import ModelPool, ModelSpec

    torch.set_num_threads(threads)
    model, tokenizer = models.load("embedded")
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    plans = [plan_for(sweep, size, budget, tokenizer, repeat) for repeat in range(repeats)]
    run_once(plan_for("chain", 2, budget, tokenizer, WARM_UP_REPEAT), pool)  # lazy imports, first-call costs
    baseline = rss()
    before = prompt_prefills(model)
    measured = [run_once(plan, pool) for plan in plans]
    after = prompt_prefills(model)
    result = measured[-1][0]
    peaks = [round(peak.peak / 2**20 - baseline / 2**20, 1) for _, _, peak in measured]
    return {
        "sweep": sweep, "size": size, "budget": budget, "baseline_rss_mib": round(baseline / 2**20, 1),
        "median_s": round(statistics.median(seconds for _, seconds, _ in measured), 3),
        "each_s": [round(seconds, 3) for _, seconds, _ in measured],
        "peak_rss_growth_mib": max(peaks),
        # the process's own peak too: the growth above depends on what the warm-up left in
        # the allocator, which differs between processes by tens of MiB
        "peak_rss_mib": round(max(peak.peak for _, _, peak in measured) / 2**20, 1),
        "each_peak_rss_growth_mib": peaks,
        "peak_rss_method": ",".join(sorted({peak.method for _, _, peak in measured})),
        "steps": steps(result),
        "hops": [{"source": hop.source, "target": hop.target, "total_positions": hop.total_positions,
                  "inherited_positions": hop.inherited_positions, "budget": hop.budget,
                  "kept_positions": hop.kept_positions, "payload_bytes": hop.payload_bytes}
                 for hop in result.hops],
        "final_positions": result.nodes["final"].positions,
        "payload_bytes_total": sum(hop.payload_bytes for hop in result.hops),
        "prompt_prefills": {key: after[key] - before[key] for key in after},
    }


def slope(sizes: list[float], values: list[float]) -> float | None:
    """Least-squares slope of log(value) against log(size): the growth exponent."""
    points = [(math.log(s), math.log(v)) for s, v in zip(sizes, values) if v > 0]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in points) / spread, 2) if spread else None


def run_sweep(sweep: str, repeats: int, threads: int, sizes: list[int]) -> dict[str, Any]:
    rows = []
    for position, size in enumerate(sizes):
        order = list(BUDGETS) if position % 2 == 0 else list(reversed(BUDGETS))
        row: dict[str, Any] = {"sweep": sweep, "size": size, "order": order}
        for budget in order:  # one process per budget, one right after the other
            command = [sys.executable, __file__, "--one", sweep, str(size), budget, "--repeats", str(repeats),
                       "--threads", str(threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{sweep} {size} {budget} failed:\n{done.stderr[-4000:]}")
            row[budget] = json.loads(done.stdout)
        rows.append(row)
        print(f"{sweep} {size}: " + ", ".join(f"{b} {row[b]['median_s']} s, +{row[b]['peak_rss_growth_mib']} MiB"
                                             for b in BUDGETS), file=sys.stderr, flush=True)
    growth = {}
    for budget in BUDGETS:
        growth[budget] = {
            "latency_slope": slope(sizes, [row[budget]["median_s"] for row in rows]),
            "peak_rss_slope": slope(sizes, [max(row[budget]["peak_rss_growth_mib"], 0.1) for row in rows]),
            "payload_slope": slope(sizes, [row[budget]["payload_bytes_total"] for row in rows]),
        }
    return {"benchmark": "scaling", "sweep": sweep, "sizes": sizes, "repeats": repeats, "threads": threads,
            "rows": rows, "growth": growth, "machine": platform.machine(), "cpu_count": os.cpu_count()}


def plot(files: list[Path], directory: Path) -> list[Path]:
    """The figures of docs/performance.md from sweep JSON files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = {data["sweep"]: data for data in (json.loads(path.read_text()) for path in files)}
    directory.mkdir(parents=True, exist_ok=True)
    labels = {"chain": "readers in the chain", "fanout": "readers in the fan-out", "document": "document tokens"}
    written = []
    for metric, title, unit in (("median_s", "median latency", "s"), ("peak_rss_growth_mib", "peak RSS growth", "MiB")):
        figure, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps), 3.4), squeeze=False)
        for axis, (name, data) in zip(axes[0], sweeps.items()):
            for budget in BUDGETS:
                axis.plot(data["sizes"], [row[budget][metric] for row in data["rows"]], marker="o", label=budget)
            axis.set_xscale("log", base=2)
            axis.set_xticks(data["sizes"], [str(size) for size in data["sizes"]])
            axis.set_xlabel(labels[name])
            axis.set_ylabel(f"{title} ({unit})")
            axis.grid(alpha=0.3)
            axis.legend()
        figure.tight_layout()
        path = directory / f"scaling_{'latency' if metric == 'median_s' else 'memory'}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    if "chain" in sweeps:
        longest = sweeps["chain"]["rows"][-1]
        figure, axes = plt.subplots(1, 3, figsize=(12.6, 3.4))
        for budget in BUDGETS:
            hops = longest[budget]["hops"]
            readers = longest[budget]["steps"].get("each_reader_s", [])
            axes[0].plot(range(1, len(hops) + 1), [hop["kept_positions"] for hop in hops], marker=".", label=budget)
            axes[1].plot(range(1, len(hops) + 1), [hop["payload_bytes"] / 1024 for hop in hops], marker=".", label=budget)
            axes[2].plot(range(1, len(readers) + 1), readers, marker=".", label=budget)
        axes[0].set_ylabel("positions kept")
        axes[1].set_ylabel("payload (KiB)")
        axes[2].set_ylabel("reader's node (s)")
        for axis, what in zip(axes, ("hop", "hop", "reader")):
            axis.set_xlabel(f"{what} of the {longest['size']}-reader chain")
            axis.grid(alpha=0.3)
            axis.legend()
        figure.tight_layout()
        path = directory / "scaling_chain_hops.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", choices=sorted(SWEEPS))
    parser.add_argument("--sizes", default=None, help="comma-separated sizes (default: the sweep's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the sweep's JSON here")
    parser.add_argument("--one", nargs=3, metavar=("SWEEP", "SIZE", "BUDGET"), help=argparse.SUPPRESS)
    parser.add_argument("--plot", nargs="+", type=Path, default=None, help="sweep JSON files to draw")
    parser.add_argument("--figures", type=Path, default=ROOT / "docs" / "img" / "scaling")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.one[2], args.repeats, args.threads)))
        return
    if args.plot:
        print(json.dumps({"figures": [str(path) for path in plot(args.plot, args.figures)]}))
        return
    if args.sweep is None:
        parser.error("pass --sweep (chain, fanout or document) or --plot FILES")
    sizes = [int(size) for size in args.sizes.split(",")] if args.sizes else SWEEPS[args.sweep]
    report = run_sweep(args.sweep, args.repeats, args.threads, sizes)
    report["load_average_at_end"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
