"""A GPU check ready to run (issue 28): do a CUDA device and the CPU agree, and how fast is it?

On a machine with CUDA and no network: tiny random models of every supported family are
built in-process (`rclc.testing`), one copy on the CPU and one on the device with the same
weights, and the script checks that the two agree on

- the positions CacheBack keeps (r4, a fixed request), sender by sender;
- the delivered rows of a transfer (`rclc.transfer`) to within float32 rounding;
- a snapshot written on the device and loaded back (rows, IDs, counts exact; cache close);
- greedy tokens of generations decoded together in the device's batching engine against
  each decoded alone on the CPU (equal, or differing first where the CPU's top-2 margin was
  a float32 near-tie, < 1e-4);

then times, on the device, batched decode (tokens per second at batch 1, 8 and 32) and a
selection (CacheBack over 512 and 2,048 positions, against the plain request forward). It
writes one JSON file and exits 1 when any check disagrees. With `--device cpu` both sides
are the CPU: the unit tests run it that way so it cannot rot.

Run (on a CUDA machine): python benchmarks/gpu_check.py --device cuda --out gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rclc  # noqa: E402
from rclc import testing  # noqa: E402
from rclc._cache import cache_layers, forward_rows, view_cache  # noqa: E402
from rclc.backends.hf_batching import engine_for  # noqa: E402
from rclc.selectors import cacheback  # noqa: E402

FAMILIES = ("qwen3", "llama")
DOCUMENT = (
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. "
    "The Birch project is owned by Bob and launched on 9 June 2019 in Lima. "
) * 3
REQUEST = "Who owns Cedar and when did it launch?"
PROMPTS = ["Who owns Cedar?", "When did Birch launch?", "The owner of Birch is", "Cedar launched in"]
NEAR_TIE = 1e-4


def pair(family: str, tokenizer: Any, device: str) -> tuple[Any, Any]:
    """The same tiny model twice: on the CPU and on `device` (identical weights)."""
    host, _ = testing.tiny_model(family, tokenizer=tokenizer, seed=5)
    other, _ = testing.tiny_model(family, tokenizer=tokenizer, seed=5)
    return host, other.to(device)


def kept_positions(host: Any, device_model: Any, tokenizer: Any) -> dict[str, Any]:
    found = {}
    for name, model in (("cpu", host), ("device", device_model)):
        sender = rclc.sender_from_hf(model, tokenizer, DOCUMENT)
        request = sender.request_ids(REQUEST)
        found[name] = list(cacheback(sender, request, -(-sender.positions // 4)))
    return {"agree": found["cpu"] == found["device"], "kept": len(found["cpu"]),
            "differing": len(set(found["cpu"]) ^ set(found["device"]))}


def delivered_rows(host: Any, device_model: Any, tokenizer: Any) -> dict[str, Any]:
    rows = {}
    for name, model in (("cpu", host), ("device", device_model)):
        sender = rclc.bind(model, tokenizer, prompt=DOCUMENT)
        receiver = rclc.bind(model, tokenizer)
        rclc.transfer_sync(sender, receiver, REQUEST, ratio=4)
        delivery, _ = receiver.peek(0)
        rows[name] = delivery.rows(model.get_input_embeddings().weight).float().cpu()
    same_shape = rows["cpu"].shape == rows["device"].shape
    difference = float((rows["cpu"] - rows["device"]).abs().max()) if same_shape else float("inf")
    return {"agree": same_shape and difference <= 1e-4, "largest_difference": difference,
            "positions": int(rows["cpu"].shape[0])}


def snapshot_round_trip(device_model: Any, tokenizer: Any) -> dict[str, Any]:
    agent = rclc.bind(device_model, tokenizer, prompt=DOCUMENT)
    before = agent.sender_state()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "state.safetensors"
        anyio.run(agent.save, path)
        restored = rclc.bind(device_model, tokenizer)
        anyio.run(restored.load, path)
    after = restored.sender_state()
    exact = torch.equal(before.input_embeds, after.input_embeds) and torch.equal(before.token_ids, after.token_ids)
    difference = max(float((k - k2).abs().max()) for (k, _), (k2, _) in
                     zip(cache_layers(before.past_key_values), cache_layers(after.past_key_values)))
    return {"agree": exact and difference <= 1e-4, "rows_and_ids_exact": exact, "largest_cache_difference": difference}


def greedy_tokens(host: Any, device_model: Any, tokenizer: Any) -> dict[str, Any]:
    alone = []
    with engine_for(host).tracing() as trace:
        for prompt in PROMPTS:
            alone.append(anyio.run(lambda p=prompt: rclc.bind(host, tokenizer).generate(p, max_new_tokens=12)).token_ids)
    margins = {entry.tokens: entry.margins for entry in trace}
    together: list[Any] = [None] * len(PROMPTS)

    async def batched() -> None:
        async with anyio.create_task_group() as group:
            for index, prompt in enumerate(PROMPTS):
                async def one(index: int = index, prompt: str = prompt) -> None:
                    together[index] = (await rclc.bind(device_model, tokenizer).generate(prompt, max_new_tokens=12)).token_ids
                group.start_soon(one)

    anyio.run(batched)
    differing, explained = 0, 0
    for reference, found in zip(alone, together):
        if reference == found:
            continue
        differing += 1
        first = next((i for i, (a, b) in enumerate(zip(reference, found)) if a != b), min(len(reference), len(found)))
        margin = margins.get(reference, ())
        explained += first < len(margin) and margin[first] < NEAR_TIE
    return {"agree": differing == explained, "sequences": len(PROMPTS), "differing": differing,
            "near_ties": explained, "batch_sizes": rclc.batching_report(device_model)["batch_sizes"]}


def decode_speed(model: Any, tokenizer: Any, sizes: tuple[int, ...], tokens: int) -> dict[str, float]:
    speeds = {}
    for size in sizes:
        async def many() -> None:
            async with anyio.create_task_group() as group:
                for index in range(size):
                    group.start_soon(lambda i=index: rclc.bind(model, tokenizer).generate(
                        PROMPTS[i % len(PROMPTS)], max_new_tokens=tokens))

        anyio.run(many)  # warm-up
        synchronize(model)
        began = time.perf_counter()
        anyio.run(many)
        synchronize(model)
        speeds[str(size)] = round(size * tokens / (time.perf_counter() - began), 1)
    return speeds


def selection_speed(model: Any, tokenizer: Any, sizes: tuple[int, ...], repeats: int) -> dict[str, Any]:
    results = {}
    weight = model.get_input_embeddings().weight
    for size in sizes:
        ids = torch.tensor(tokenizer(DOCUMENT * (size // 40 + 1), add_special_tokens=False)["input_ids"][:size],
                           device=weight.device)
        sender = rclc.sender_from_hf(model, tokenizer, ids.unsqueeze(0))
        request = sender.request_ids(REQUEST)

        def select() -> None:
            cacheback(sender, request, size // 4)

        def floor() -> None:
            with torch.inference_mode():
                forward_rows(model, view_cache(model, sender.past_key_values), input_ids=request)

        times: dict[str, list[float]] = {"selection": [], "forward": []}
        for _ in range(repeats):
            for name, function in (("selection", select), ("forward", floor)):
                synchronize(model)
                began = time.perf_counter()
                function()
                synchronize(model)
                times[name].append(time.perf_counter() - began)
        selection, forward = (statistics.median(times[name]) for name in ("selection", "forward"))
        results[str(size)] = {"selection_ms": round(selection * 1e3, 3), "forward_ms": round(forward * 1e3, 3),
                              "ratio": round(selection / forward, 3)}
    return results


def synchronize(model: Any) -> None:
    device = model.get_input_embeddings().weight.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(device: str, *, quick: bool, families: tuple[str, ...] = FAMILIES) -> dict[str, Any]:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: CUDA is not available here; pass --device cpu to check the script itself")
    tokenizer = testing.tiny_tokenizer()
    report: dict[str, Any] = {"benchmark": "gpu_check", "device": device, "checks": {}, "timings": {}}
    if device.startswith("cuda"):
        report["device_name"] = torch.cuda.get_device_name(torch.device(device))
    for family in families:
        host, device_model = pair(family, tokenizer, device)
        report["checks"][family] = {
            "kept_positions": kept_positions(host, device_model, tokenizer),
            "delivered_rows": delivered_rows(host, device_model, tokenizer),
            "snapshot_round_trip": snapshot_round_trip(device_model, tokenizer),
            "batched_greedy_tokens": greedy_tokens(host, device_model, tokenizer),
        }
        report["timings"][family] = {
            "decode_tokens_per_second": decode_speed(device_model, tokenizer, (1, 4) if quick else (1, 8, 32),
                                                     4 if quick else 32),
            "selection": selection_speed(device_model, tokenizer, (128,) if quick else (512, 2048), 2 if quick else 9),
        }
    report["agree"] = all(check["agree"] for family in report["checks"].values() for check in family.values())
    report |= {"torch": torch.__version__, "cuda": torch.version.cuda, "machine": platform.machine(),
               "note": "tiny random models: the timings compare batch sizes and selection with its floor, "
                       "not checkpoints"}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (checks the script itself)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--quick", action="store_true", help="small timings (what the unit test runs)")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated tiny model families")
    args = parser.parse_args(argv)
    report = run(args.device, quick=args.quick, families=tuple(args.families.split(",")))
    report["load_average"] = os.getloadavg()
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(json.dumps({"agree": report["agree"], "out": str(args.out)}))
    return 0 if report["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
