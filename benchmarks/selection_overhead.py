"""Selection overhead of CacheBack against the floor every request-conditioned selector pays.

For sender states of several lengths (prefilled from synthetic document text on the
embedded SmolLM2-135M) and one 32-token request, this times, interleaved A/B in the same
run:

- `selection`: the whole `cacheback(sender, request_ids, budget)` call (capture forward,
  support fold, composite score, keep step), and
- `forward`: a plain backbone forward of the same request over a view of the same cache,
  built the same way (`rclc._cache.view_cache` + `forward_rows`), which is what any
  selector conditioned on the request must at least run.

It also times what the handoff saves on the other side, `receiver_prefill`: the
receiver's prefill (a fresh backbone forward, as `generate` starts with) of the received
rows followed by the same 32-token request as its prompt, for the full state and for
CacheBack r4 and r16 handoffs of it (budgets `ceil(T/4)`, `ceil(T/16)`), measured
interleaved (the order rotates every repeat), with medians and ratios to full.

Prints one JSON object. Per size: wall-clock medians and their `ratio` (target: at most
1.1 at 2048 positions, issue 28; the capture computes each global layer's attention once,
from the fold's own softmax), `pair_ratio_median` (median over back-to-back A/B pairs),
CPU-time medians and `cpu_ratio` (steadier on a shared machine), and a breakdown: the
scores alone, the time spent inside the fold, and the keep step. `switch` compares the
cost of switching attention dispatch and back by direct config writes (what the capture
does) with `model.set_attn_implementation`.

Runs single-threaded by default (`--threads 1`): on a shared 2-core machine two torch
threads wait on each other and produce multi-second outliers.

    PYTHONPATH=$PWD python benchmarks/selection_overhead.py --sizes 512,2048,4096
    PYTHONPATH=$PWD python benchmarks/selection_overhead.py --only-prefill
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
from rclc.policy import BudgetPolicy
from rclc._cache import forward_rows, prefill, view_cache
from rclc.selectors import cacheback
from rclc.selectors import _support
from rclc.selectors._attention_capture import CAPTURE_NAME, reachable_configs
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
    """Wraps SupportFold._fold (what both `__call__` and `attend` run) to sum the time spent
    inside folds; with `attend` that includes the layer's attention output the fold computes."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.original = _support.SupportFold._fold

    def __enter__(self) -> _TimedFold:
        original = self.original

        def timed(fold: Any, *args: Any) -> Any:
            start = time.perf_counter()
            result = original(fold, *args)
            self.seconds += time.perf_counter() - start
            return result

        _support.SupportFold._fold = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        _support.SupportFold._fold = self.original  # type: ignore[method-assign]


PREFILL_RATIOS = (4, 16)


def receiver_prefill(sender: SenderState, request: torch.Tensor, repeats: int, warmup: int) -> dict[str, Any]:
    """Receiver prefill of full / r4 / r16 handoffs plus the request as the receiver's prompt.

    The received rows are the sender's kept input rows (what an `embeddings` message
    carries); the prefill is a fresh forward of `rows + prompt`, as the receiver's
    `generate` runs it. Arms alternate inside each repeat, rotating the order.
    """
    model = sender.model
    prompt_rows = model.get_input_embeddings().weight[request[0]].detach()
    arms: dict[str, torch.Tensor] = {"full": sender.input_embeds}
    for ratio in PREFILL_RATIOS:
        budget = BudgetPolicy(ratio=ratio).cap(sender.positions)
        kept = torch.tensor(cacheback(sender, request, budget), dtype=torch.int64)
        arms[f"r{ratio}"] = sender.input_embeds.index_select(0, kept)
    inputs = {name: torch.cat([rows, prompt_rows], dim=0).detach() for name, rows in arms.items()}

    def run(rows: torch.Tensor) -> None:
        with torch.inference_mode():
            prefill(model, rows)

    for _ in range(warmup):
        for rows in inputs.values():
            run(rows)
    names = list(inputs)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(_wall_and_cpu(lambda: run(inputs[name])))
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in times.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in times.items()}
    result: dict[str, Any] = {"prompt_tokens": int(request.shape[1])}
    for name in names:
        result[name] = {
            "received_positions": int(arms[name].shape[0]),
            "prefill_ms": round(wall[name] * 1e3, 2),
            "prefill_cpu_ms": round(cpu[name] * 1e3, 2),
            "ratio_to_full": round(wall[name] / wall["full"], 4),
            "cpu_ratio_to_full": round(cpu[name] / cpu["full"], 4),
        }
    return result


def measure(
    model: Any,
    tokenizer: Any,
    positions: int,
    repeats: int,
    warmup: int,
    *,
    selection: bool = True,
    prefill_too: bool = True,
) -> dict[str, Any]:
    sender = build_sender(model, tokenizer, positions)
    request = request_ids(tokenizer)
    result: dict[str, Any] = {"positions": positions, "request_tokens": int(request.shape[1])}
    if selection:
        result.update(measure_selection(sender, request, repeats, warmup))
    if prefill_too:
        result["receiver_prefill"] = receiver_prefill(sender, request, repeats, warmup)
    return result


def measure_selection(sender: SenderState, request: torch.Tensor, repeats: int, warmup: int) -> dict[str, Any]:
    """CacheBack selection vs a plain request forward (and the score/fold/keep breakdown)."""
    budget = sender.positions // 4
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
    parser.add_argument("--only-prefill", action="store_true", help="time only the receiver prefill")
    parser.add_argument("--no-prefill", action="store_true", help="skip the receiver prefill")
    args = parser.parse_args()
    if args.only_prefill and args.no_prefill:
        parser.error("--only-prefill and --no-prefill exclude each other")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = models.load("embedded")
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    results: dict[str, Any] = {
        "model": models.EMBEDDED_CHECKPOINT,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
    if not args.only_prefill:
        results["switch"] = {k: round(v, 4) for k, v in switch_costs(model).items()}
    results["sizes"] = [
        measure(
            model, tokenizer, size, args.repeats, args.warmup,
            selection=not args.only_prefill, prefill_too=not args.no_prefill,
        )
        for size in sizes
    ]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
