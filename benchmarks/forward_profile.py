"""Where N fanout_qa runs spend the model's forwards: per kind of forward, and over time.

Why: `concurrent_runs.py` says how many runs a minute the concurrent phase reaches and, with
`ratio_if_every_core_busy`, how far idle cores keep it from the machine's limit. This says
which forwards fill the CPU seconds and when each kind runs, so a change can be aimed at the
kind that costs the most or at the stretch where a core idles.

It wraps the forward of the embedded model's decoder stack (the instance, not the class:
nothing else in the process is touched) and records for every forward its thread, wall
start and end, the thread's CPU seconds and its rows (batch x positions, padding included).
Each forward is named by the rclc function that asked for it, found on the call stack:

- `request capture`: a selector's capture of request rows over senders' caches;
- `worker prefill`: prompt prefills run by worker threads (the readers' prompts);
- `engine prefill`: the batching engine's prefills (the answerers' prompts);
- `decode`: the batching engine's decode steps (both halves of a step split across two
  cores: the half forwarded by the helper thread has `_decode_rows` on its stack, not
  `decode_step`; until 2026-12-06 it was counted as `other`);
- `state completion`: the forward of a generation's last token into its state;
- `other`: anything else.

The measured phase follows one warm-up run and, for `--mode concurrent`, one warm-up
concurrent phase on other inputs (so the prefix store is as warm as in concurrent_runs.py's
later repeats). Wall times under this wrapper are close to the benchmark's but not equal;
compare kinds and stretches within one output, not across scripts. Prints one JSON object:
per kind the forwards, rows, CPU seconds and wall seconds; per tenth of the phase the cores
each kind kept busy (wall time of its forwards over the stretch: more than the usable cores
means threads waited for a core).

    PYTHONPATH=$PWD python benchmarks/forward_profile.py [--runs 32] [--mode concurrent|sequential]
        [--threads 1] [--stretches 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from concurrent_runs import ROOT, concurrent, cpu_seconds, fanout_plans, sequential  # noqa: E402

sys.path.insert(0, str(ROOT))

from rclc._cache import backbone  # noqa: E402
from rclc._flat_combining import usable_cores  # noqa: E402
from rclc_graph import ModelPool  # noqa: E402

KINDS = {
    "capture_each": "request capture",
    "capture": "request capture",
    "_suffixes": "worker prefill",
    "prefill_many": "engine prefill",
    "_prefill": "engine prefill",
    "decode_step": "decode",
    "_decode_rows": "decode",  # a split step's half in the helper thread (rclc.backends.batch_cache)
    "continuation": "state completion",
}
"""rclc function names on a forward's call stack -> the kind of forward (nearest frame wins)."""


def kind_of_caller(depth: int = 2, frames: int = 30) -> str:
    frame = sys._getframe(depth)
    for _ in range(frames):
        if frame is None:
            break
        kind = KINDS.get(frame.f_code.co_name)
        if kind is not None:
            return kind
        frame = frame.f_back
    return "other"


class ForwardLog:
    """Every forward of one decoder instance while recording (thread-safe appends)."""

    def __init__(self, decoder: Any) -> None:
        self.events: list[tuple[int, str, float, float, float, int]] = []
        self.recording = False
        self._lock = threading.Lock()
        forward = decoder.forward

        def logged(*args: Any, **kwargs: Any) -> Any:
            if not self.recording:
                return forward(*args, **kwargs)
            began, cpu = time.perf_counter(), time.thread_time()
            output = forward(*args, **kwargs)
            rows = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
            count = int(rows.shape[0]) * int(rows.shape[1]) if rows is not None else 0
            event = (threading.get_ident(), kind_of_caller(), began, time.perf_counter(), time.thread_time() - cpu, count)
            with self._lock:
                self.events.append(event)
            return output

        decoder.forward = logged  # an instance attribute: nn.Module.__call__ finds it first


def summary(events: list[tuple[int, str, float, float, float, int]], began: float, wall: float,
            stretches: int) -> dict[str, Any]:
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: {"forwards": 0, "rows": 0, "cpu_s": 0.0, "wall_s": 0.0})
    for _, kind, start, end, cpu, rows in events:
        row = kinds[kind]
        row["forwards"] += 1
        row["rows"] += rows
        row["cpu_s"] += cpu
        row["wall_s"] += end - start
    step = wall / stretches
    timeline = []
    for index in range(stretches):
        low, high = began + index * step, began + (index + 1) * step
        busy: Counter[str] = Counter()
        for _, kind, start, end, _, _ in events:
            overlap = min(end, high) - max(start, low)
            if overlap > 0:
                busy[kind] += overlap / step
        timeline.append({"from_s": round(index * step, 2), "to_s": round((index + 1) * step, 2),
                         "cores_busy": {kind: round(value, 2) for kind, value in busy.most_common()}})
    ordered = sorted(kinds.items(), key=lambda item: -item[1]["cpu_s"])
    return {
        "kinds": {kind: {key: round(value, 2) if isinstance(value, float) else value for key, value in row.items()}
                  for kind, row in ordered},
        "forward_cpu_s": round(sum(row["cpu_s"] for row in kinds.values()), 2),
        "timeline": timeline,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--mode", choices=("concurrent", "sequential"), default="concurrent")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--stretches", type=int, default=10, help="equal parts of the phase in the timeline")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    pool = ModelPool()
    plans = fanout_plans(2 * args.runs, None)
    measured, warm = plans[:args.runs], plans[args.runs:]
    log = ForwardLog(backbone(pool.get(plans[0].models()[0]).model))

    def phase(chosen: list[Any]) -> Any:
        if args.mode == "sequential":
            return anyio.run(sequential, chosen, pool)
        return anyio.run(lambda: concurrent(chosen, pool, max_events=4, max_bytes=4096, consumer_seconds=0.02))

    anyio.run(sequential, warm[:1], pool)
    if args.mode == "concurrent":
        phase(warm)
    log.recording = True
    began, cpu = time.perf_counter(), cpu_seconds()
    phase(measured)
    wall, used = time.perf_counter() - began, cpu_seconds() - cpu
    log.recording = False
    print(json.dumps({
        "benchmark": "forward_profile",
        "model": "embedded (SmolLM2-135M-Instruct, float32)",
        "workload": "fanout_qa",
        "mode": args.mode,
        "runs": args.runs,
        "wall_s": round(wall, 2),
        "process_cpu_s": round(used, 2),
        "cores_busy": round(used / wall, 2),
        "usable_cores": usable_cores(),
        **summary(log.events, began, wall, args.stretches),
        "torch_threads": torch.get_num_threads(),
    }, indent=1))


if __name__ == "__main__":
    main()
