"""A fan-in's request captures one by one vs in one batched forward, on the embedded model.

CacheBack and QSnap score each sender by forwarding the request over its cache. For a
transfer with several senders, `rclc.selectors._prefetch` now captures them in one batched
forward (`capture_each`). This times, interleaved A/B in one process, for each sender-length
set and request length:

- `one_by_one`: `request_fold` of each sender in turn (what each selection did before);
- `batched`: `request_folds` of all senders (one forward, attention per element).

and checks what the batching may change: the largest absolute difference of every fold's
votes, energy and row energy from the one-by-one folds (0.0 means bit-identical), and
whether CacheBack r4 keeps the same positions from both.

Prints one JSON object: per case the wall and CPU medians of both, their ratios
(`one_by_one / batched`), and the differences.

    PYTHONPATH=$PWD python benchmarks/fan_in_capture.py [--lengths 64,64,64;256,512,1024]
        [--requests 12,32] [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from selection_overhead import _wall_and_cpu, build_sender, request_ids  # noqa: E402

from rclc import models  # noqa: E402
from rclc.selectors import cacheback  # noqa: E402
from rclc.selectors._support import offering, request_fold, request_folds  # noqa: E402


def largest_difference(alone: list[Any], batched: list[Any]) -> float:
    worst = 0.0
    for one, many in zip(alone, batched):
        for name in ("votes", "energy", "row_energy"):
            worst = max(worst, float((getattr(one, name) - getattr(many, name)).abs().max()))
    return worst


def same_selection(senders: list[Any], ids: torch.Tensor, batched: list[Any]) -> bool:
    for sender, fold in zip(senders, batched):
        budget = -(-sender.positions // 4)
        with offering([(sender, ids, fold)]):
            offered = cacheback(sender, ids, budget)
        if offered != cacheback(sender, ids, budget):
            return False
    return True


def measure(senders: list[Any], ids: torch.Tensor, repeats: int) -> dict[str, Any]:
    def one_by_one() -> list[Any]:
        return [request_fold(sender, ids, moments=True) for sender in senders]

    def batched() -> list[Any]:
        return request_folds(senders, [ids] * len(senders))

    for _ in range(2):  # warm-up
        one_by_one(), batched()
    times: dict[str, list[tuple[float, float]]] = {"one_by_one": [], "batched": []}
    for repeat in range(repeats):
        order = ("one_by_one", "batched") if repeat % 2 == 0 else ("batched", "one_by_one")
        for name in order:
            times[name].append(_wall_and_cpu(one_by_one if name == "one_by_one" else batched))
    wall = {name: statistics.median(t[0] for t in values) for name, values in times.items()}
    cpu = {name: statistics.median(t[1] for t in values) for name, values in times.items()}
    alone, together = one_by_one(), batched()
    return {
        "sender_positions": [sender.positions for sender in senders],
        "request_tokens": int(ids.shape[1]),
        "wall_ms": {name: round(1000 * value, 2) for name, value in wall.items()},
        "cpu_ms": {name: round(1000 * value, 2) for name, value in cpu.items()},
        "wall_ratio": round(wall["one_by_one"] / wall["batched"], 2),
        "cpu_ratio": round(cpu["one_by_one"] / cpu["batched"], 2),
        "largest_fold_difference": largest_difference(alone, together),
        "same_cacheback_r4_selection": same_selection(senders, ids, together),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="64,64,64;256,512,1024", help="sender-length sets, ';' between sets")
    parser.add_argument("--requests", default="12,32", help="request lengths in tokens")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = models.load("embedded")
    cases = []
    for lengths in args.lengths.split(";"):
        senders = [build_sender(model, tokenizer, int(length)) for length in lengths.split(",")]
        for length in args.requests.split(","):
            cases.append(measure(senders, request_ids(tokenizer, int(length)), args.repeats))
    print(json.dumps({
        "benchmark": "fan_in_capture",
        "model": "embedded (SmolLM2-135M-Instruct, float32)",
        "cases": cases,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
    }, indent=2))


if __name__ == "__main__":
    main()
