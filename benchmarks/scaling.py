"""How cost grows with the work (issue 28): longer chains, wider fan-outs, longer documents,
under a relative (r4) and a bounded (b128) budget, on the embedded SmolLM2-135M.

Three sweeps, each over one size with everything else fixed:

- `chain`: chains of 4, 8, 16 and 32 readers (`rclc_graph.chain_of_agents`), each reading a
  256-token chunk and passing its state on, then a final answer;
- `fanout`: 4, 8, 16 and 32 readers in parallel (`rclc_graph.fan_out`), one 256-token
  document each, into one answering node;
- `document`: one reader of a 256 to 4,096-token document handing state to the answering node.

Every edge's selection is conditioned on the question (`request: "{question}"`, as in the
shipped topologies). The final node generates 4 tokens (decoding is measured elsewhere: concurrent_runs.py).
Each configuration runs in a process of its own (`--one`), so its peak RSS is its own: the
model is loaded and one small run warms everything up, then the configuration runs
`--repeats` times, r4 and b128 alternating, and the process reports the median wall time,
the peak RSS above what it held before the first measured run, and per hop the payload
bytes, the positions kept and the sender's positions, plus the seconds of each step kind
(the readers' nodes, selections, the final node). `--plot` draws the figures of
docs/performance.md from the JSON files; the fitted log-log slope of each curve says how
the cost grows (1: linear in the size).

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
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


def plan_for(sweep: str, size: int, budget: str, tokenizer: Any) -> Any:
    from rclc_graph import Policy, chain_of_agents, fan_out

    policy = Policy(**BUDGETS[budget], request="{question}")  # as the shipped topologies ask
    if sweep == "chain":
        graph = chain_of_agents(size, policy=policy, max_new_tokens=ANSWER_TOKENS)
        return graph.plan({"question": QUESTION,
                           "chunks": [document(tokenizer, PIECE_TOKENS, index) for index in range(size)]})
    count, tokens = (size, PIECE_TOKENS) if sweep == "fanout" else (1, size)
    graph = fan_out(count, policy=policy, max_new_tokens=ANSWER_TOKENS)
    return graph.plan({"question": QUESTION,
                       "documents": [document(tokenizer, tokens, index) for index in range(count)]})


class PeakRss:
    """Peak resident set size of this process while the block runs, sampled every 5 ms."""

    def __enter__(self) -> PeakRss:
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_once(plan: Any, pool: Any) -> tuple[Any, float, int]:
    import anyio

    from rclc_graph import run_plan

    with PeakRss() as peak:
        began = time.perf_counter()
        result = anyio.run(lambda: run_plan(plan, pool=pool))
        seconds = time.perf_counter() - began
    if result.status != "finished":
        raise RuntimeError(f"the run did not finish: {result.status} {result.error}")
    return result, seconds, peak.peak


def steps(result: Any) -> dict[str, float]:
    """Seconds per step kind: the readers' nodes (prefill, plus the selection of the hops
    into them), the selections (summed over hops) and the final node (its hops' selection,
    its prefill and its 4 tokens)."""
    readers = sum(node.finished_at - node.started_at for name, node in result.nodes.items() if name != "final")
    final = result.nodes["final"]
    return {
        "readers_s": round(readers, 3),
        "selection_s": round(sum(hop.selection_seconds for hop in result.hops), 3),
        "final_s": round(final.finished_at - final.started_at, 3),
    }


def measure_one(sweep: str, size: int, repeats: int, threads: int) -> dict[str, Any]:
    """One configuration (both budgets, alternating) in this process."""
    import torch

    from rclc import models
    from rclc_graph import ModelPool, ModelSpec

    torch.set_num_threads(threads)
    model, tokenizer = models.load("embedded")
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    plans = {budget: plan_for(sweep, size, budget, tokenizer) for budget in BUDGETS}
    run_once(plan_for("chain", 2, "r4", tokenizer), pool)  # warm-up: lazy imports, first-call costs
    baseline = rss()
    runs: dict[str, list[tuple[Any, float, int]]] = {budget: [] for budget in BUDGETS}
    for repeat in range(repeats):
        order = list(BUDGETS) if repeat % 2 == 0 else list(reversed(BUDGETS))
        for budget in order:
            runs[budget].append(run_once(plans[budget], pool))
    report: dict[str, Any] = {"sweep": sweep, "size": size, "baseline_rss_mib": round(baseline / 2**20, 1)}
    for budget, measured in runs.items():
        result = measured[-1][0]
        report[budget] = {
            "median_s": round(statistics.median(seconds for _, seconds, _ in measured), 3),
            "each_s": [round(seconds, 3) for _, seconds, _ in measured],
            "peak_rss_growth_mib": round(max(peak for _, _, peak in measured) / 2**20 - baseline / 2**20, 1),
            "steps": steps(result),
            "hops": [{"source": hop.source, "target": hop.target, "total_positions": hop.total_positions,
                      "inherited_positions": hop.inherited_positions, "budget": hop.budget,
                      "kept_positions": hop.kept_positions, "payload_bytes": hop.payload_bytes}
                     for hop in result.hops],
            "final_positions": result.nodes["final"].positions,
            "payload_bytes_total": sum(hop.payload_bytes for hop in result.hops),
        }
    return report


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
    for size in sizes:
        command = [sys.executable, __file__, "--one", sweep, str(size), "--repeats", str(repeats),
                   "--threads", str(threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{sweep} {size} failed:\n{done.stderr[-4000:]}")
        rows.append(json.loads(done.stdout))
        print(f"{sweep} {size}: " + ", ".join(f"{b} {rows[-1][b]['median_s']} s, +{rows[-1][b]['peak_rss_growth_mib']} MiB"
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
        figure, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
        for budget in BUDGETS:
            hops = longest[budget]["hops"]
            axes[0].plot(range(1, len(hops) + 1), [hop["kept_positions"] for hop in hops], marker=".", label=budget)
            axes[1].plot(range(1, len(hops) + 1), [hop["payload_bytes"] / 1024 for hop in hops], marker=".", label=budget)
        axes[0].set_ylabel("positions kept")
        axes[1].set_ylabel("payload (KiB)")
        for axis in axes:
            axis.set_xlabel(f"hop of the {longest['size']}-reader chain")
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
    parser.add_argument("--one", nargs=2, metavar=("SWEEP", "SIZE"), help=argparse.SUPPRESS)
    parser.add_argument("--plot", nargs="+", type=Path, default=None, help="sweep JSON files to draw")
    parser.add_argument("--figures", type=Path, default=ROOT / "docs" / "img" / "scaling")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.repeats, args.threads)))
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
