"""Selection overhead of CacheBack against the floor every request-conditioned selector pays.

For sender states of several lengths (prefilled from synthetic document text on the
embedded SmolLM2-135M) and one 32-token request, this times, interleaved A/B in the same
run:

- `selection`: the whole `cacheback(sender, request_ids, budget)` call (capture forward,
  support fold, composite score, keep step), and
- `forward`: a plain backbone forward of the same request over a view of the same cache,
  built the same way (`rclc._cache.view_cache` + `forward_rows`), which is what any
  selector conditioned on the request must at least run.

Prints one JSON object. Per size: wall-clock medians and their `ratio` (target: at most
1.3 at 2048 positions), `pair_ratio_median` (median over back-to-back A/B pairs),
CPU-time medians and `cpu_ratio` (steadier on a shared machine), and a breakdown: the
scores alone, the time spent inside the fold, and the keep step. `switch` compares the
cost of switching attention dispatch and back by direct config writes (what the capture
does) with `model.set_attn_implementation`.

Runs single-threaded by default (`--threads 1`): on a shared 2-core machine two torch
threads wait on each other and produce multi-second outliers.

    PYTHONPATH=$PWD python benchmarks/selection_overhead.py --sizes 512,2048,4096
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import torch

from rclc import models
from rclc._cache import forward_rows, prefill, view_cache
from rclc.selectors import cacheback
from rclc.selectors import _support
from rclc.selectors._capture import CAPTURE_NAME, reachable_configs
from rclc.selectors._spans import fixed_span_keep
from rclc.selectors.cacheback import _scores as cacheback_scores_unchecked
from rclc.state import SenderState

REQUEST = (
    "Which project did the team based in Lisbon launch, who owns it, and in which year did it start? "
    "Answer briefly."
)

_PEOPLE = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lena"]
_CITIES = ["Oslo", "Lima", "Lisbon", "Nairobi", "Hanoi", "Quito", "Tallinn", "Perth", "Accra", "Porto"]
_THINGS = ["Cedar", "Birch", "Maple", "Aspen", "Rowan", "Alder", "Willow", "Hazel", "Juniper", "Larch"]


def synthetic_document(min_tokens: int, tokenizer: Any) -> list[int]:
    """Deterministic report-like sentences about projects, people, places and dates."""
    sentences = []
    index = 0
    ids: list[int] = []
    while len(ids) < min_tokens:
        person, city = _PEOPLE[index % len(_PEOPLE)], _CITIES[(index * 7) % len(_CITIES)]
        thing = f"{_THINGS[(index * 3) % len(_THINGS)]}-{index}"
        year = 1990 + (index * 13) % 35
        sentences.append(
            f"The {thing} project was launched in {year} by a team based in {city}; {person} owns it "
            f"and reports {index % 9 + 2} milestones to the board each quarter."
        )
        index += 1
        if index % 16 == 0:
            ids = tokenizer(" ".join(sentences), add_special_tokens=False)["input_ids"]
    return ids[:min_tokens]


def build_sender(model: Any, tokenizer: Any, positions: int) -> SenderState:
    ids = torch.tensor(synthetic_document(positions, tokenizer), dtype=torch.int64)
    rows = model.get_input_embeddings().weight[ids].detach()
    return SenderState(model, prefill(model, rows), rows, tokenizer=tokenizer, token_ids=ids)


def request_ids(tokenizer: Any, length: int = 32) -> torch.Tensor:
    ids = tokenizer(REQUEST * 4, add_special_tokens=False)["input_ids"][:length]
    return torch.tensor([ids], dtype=torch.int64)


def _time(function: Any) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _wall_and_cpu(function: Any) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds: on a shared machine the CPU time is not
    inflated by waiting for a core, so its ratio is the steadier of the two."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def plain_forward(sender: SenderState, request: torch.Tensor) -> None:
    with torch.inference_mode():
        forward_rows(sender.model, view_cache(sender.model, sender.past_key_values), input_ids=request)


def switch_costs(model: Any, repeats: int = 50) -> dict[str, float]:
    """Milliseconds per switch-and-restore: direct config writes vs `set_attn_implementation`."""

    def direct() -> None:
        configs = reachable_configs(model)
        saved = [(c, c._attn_implementation_internal) for c in configs]
        for c in configs:
            c._attn_implementation_internal = CAPTURE_NAME
        for c, value in saved:
            c._attn_implementation_internal = value

    def public() -> None:
        model.set_attn_implementation("eager")
        model.set_attn_implementation("sdpa")

    result = {}
    for name, function in (("direct_ms", direct), ("set_attn_implementation_ms", public)):
        function()
        result[name] = statistics.median(_time(function) for _ in range(repeats)) * 1e3
    return result


class _TimedFold:
    """Wraps SupportFold.__call__ to sum the time spent inside folds."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.original = _support.SupportFold.__call__

    def __enter__(self) -> _TimedFold:
        original = self.original

        def timed(fold: Any, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
            start = time.perf_counter()
            original(fold, query, key, scaling)
            self.seconds += time.perf_counter() - start

        _support.SupportFold.__call__ = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        _support.SupportFold.__call__ = self.original  # type: ignore[method-assign]


def measure(model: Any, tokenizer: Any, positions: int, repeats: int, warmup: int) -> dict[str, Any]:
    sender = build_sender(model, tokenizer, positions)
    request = request_ids(tokenizer)
    budget = positions // 4
    for _ in range(warmup):
        cacheback(sender, request, budget)
        plain_forward(sender, request)
    runs: dict[str, list[tuple[float, float]]] = {"selection": [], "forward": []}
    for repeat in range(repeats):
        pair = [
            ("selection", lambda: cacheback(sender, request, budget)),
            ("forward", lambda: plain_forward(sender, request)),
        ]
        if repeat % 2:
            pair.reverse()
        for name, function in pair:
            runs[name].append(_wall_and_cpu(function))
    selection = [wall for wall, _ in runs["selection"]]
    forward = [wall for wall, _ in runs["forward"]]
    selection_cpu = statistics.median(cpu for _, cpu in runs["selection"])
    forward_cpu = statistics.median(cpu for _, cpu in runs["forward"])
    with _TimedFold() as timed:
        scores_runs = []
        for _ in range(max(3, repeats // 2)):
            before = timed.seconds
            start = time.perf_counter()
            scores = cacheback_scores_unchecked(sender, request)
            scores_runs.append((time.perf_counter() - start, timed.seconds - before))
    keep = statistics.median(_time(lambda: fixed_span_keep(scores, budget, 16)) for _ in range(repeats))
    selection_ms = statistics.median(selection) * 1e3
    forward_ms = statistics.median(forward) * 1e3
    return {
        "positions": positions,
        "request_tokens": int(request.shape[1]),
        "budget": budget,
        "selection_ms": round(selection_ms, 2),
        "forward_ms": round(forward_ms, 2),
        "ratio": round(selection_ms / forward_ms, 3),
        # Each A/B pair ran back to back, so its ratio is less exposed to load drifting on a
        # shared machine than the ratio of the two medians.
        "pair_ratio_median": round(statistics.median(a / b for a, b in zip(selection, forward)), 3),
        "selection_cpu_ms": round(selection_cpu * 1e3, 2),
        "forward_cpu_ms": round(forward_cpu * 1e3, 2),
        "cpu_ratio": round(selection_cpu / forward_cpu, 3),
        "scores_ms": round(statistics.median(run[0] for run in scores_runs) * 1e3, 2),
        "fold_ms": round(statistics.median(run[1] for run in scores_runs) * 1e3, 2),
        "keep_ms": round(keep * 1e3, 3),
        "selection_runs_ms": [round(s * 1e3, 2) for s in selection],
        "forward_runs_ms": [round(s * 1e3, 2) for s in forward],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="512,2048,4096", help="comma-separated sender positions")
    parser.add_argument("--repeats", type=int, default=9, help="A/B pairs per size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared 2-core machine two threads give multi-second outliers; "
        "0 leaves torch's default)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = models.load("embedded")
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    results = {
        "model": models.EMBEDDED_CHECKPOINT,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "switch": {k: round(v, 4) for k, v in switch_costs(model).items()},
        "sizes": [measure(model, tokenizer, size, args.repeats, args.warmup) for size in sizes],
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
