"""Memory of one reader's steps against its document's length (issue 28): binding a sender
(`rclc.sender_from_hf`, one prefill) and a bounded transfer from it (`rclc.transfer_sync`,
budget 128, conditioned on a question), on the embedded SmolLM2-135M.

Why: the document sweep of `scaling.py` measures a whole graph run's peak RSS, which also
counts memory the allocator keeps after it is freed. This isolates the core's steps and
reports the live tensors the sender holds, so a step that grows faster than the document
shows as such, and allocator retention shows as RSS above the live tensors.

Each size runs in a process of its own (a process keeps the RSS it has freed), after a
256-token warm-up bind that pages in the weights. Peaks are the kernel's high-water mark of
each step (`peak_rss.PeakRss`, as in scaling.py and concurrent_runs.py; until 2026-12-06
they were sampled every 5 ms). Run with glibc's defaults and with
`MALLOC_MMAP_THRESHOLD_=131072` (blocks over 128 KiB mapped and unmapped, so freed
activations leave the RSS) to see both:

    python benchmarks/reader_memory.py --sizes 1024,2048,4096
    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/reader_memory.py --sizes 1024,2048,4096
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 2**20


def live_bytes(sender: Any) -> int:
    """Bytes of the distinct tensor storages the sender holds: its input rows, its token IDs
    and its cache's keys and values (each storage once, however many views share it)."""
    # private on purpose: the core's one accessor of a cache's per-layer tensors
    from rclc._cache import cache_layers

    tensors = [sender.input_embeds, sender.token_ids]
    tensors += [tensor for layer in cache_layers(sender.past_key_values) for tensor in layer]
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
                for tensor in tensors if tensor is not None}
    return sum(storages.values())


def measure(size: int) -> dict[str, Any]:
    import torch

    from rclc import HFReceiver, sender_from_hf, transfer_sync
    from rclc.models import load
    from peak_rss import PeakRss, rss
    from scaling import QUESTION, document

    torch.set_num_threads(1)
    model, tokenizer = load("embedded")
    warm = sender_from_hf(model, tokenizer, document(tokenizer, 256, 99))
    del warm
    gc.collect()
    base = rss()
    with PeakRss() as bind:
        sender = sender_from_hf(model, tokenizer, document(tokenizer, size, 0))
    bound = rss()
    receiver = HFReceiver(model, tokenizer, max_new_tokens=4)
    with PeakRss() as hop:
        transfer_sync(sender, receiver, QUESTION, budget=128)
    return {
        "size": size,
        "positions": sender.positions,
        "bind_peak_mib": round((bind.peak - base) / MIB, 1),
        "rss_after_bind_mib": round((bound - base) / MIB, 1),
        "sender_live_tensors_mib": round(live_bytes(sender) / MIB, 1),
        "transfer_peak_above_bound_mib": round((hop.peak - bound) / MIB, 1),
        "peak_rss_method": ",".join(sorted({bind.method, hop.method})),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,2048,4096", help="comma-separated document tokens")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    rows = []
    for size in [int(part) for part in args.sizes.split(",")]:
        done = subprocess.run([sys.executable, __file__, "--one", str(size)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"size {size} failed:\n{done.stderr[-4000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps({"benchmark": "reader_memory", "budget": 128, "threads": 1,
                      "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
