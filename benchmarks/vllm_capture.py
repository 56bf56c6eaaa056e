"""Capture on vLLM's CPU backend vs HF prefill on the embedded model; prints JSON.

Usage (in the vLLM environment, see scripts/install_vllm_cpu.sh):
    python benchmarks/vllm_capture.py [--repeats 5] [--lengths 64 512 1536]

Reports engine start time, per prompt length the median time of a capture prefill
(`rclc.vllm.prefill_state`: one discarded greedy request plus the page copy) and of an
HF prefill of the same rows, the shared-weight view's forward vs HF's, and the peak
resident memory of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 512, 1536])
    args = parser.parse_args()

    import torch
    import vllm

    from rclc import _cache, models
    from rclc.vllm import prefill_state, shared_view

    path = models.local_dir("embedded")
    start = time.perf_counter()
    hf_model, tokenizer = models.load("embedded")
    hf_load_s = time.perf_counter() - start
    start = time.perf_counter()
    llm = vllm.LLM(
        model=str(path),
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        enable_prompt_embeds=True,
        max_model_len=2048,
        kv_cache_memory_bytes=256 * 2**20,
        kv_transfer_config={
            "kv_connector": "RCLCCaptureConnector",
            "kv_connector_module_path": "rclc.vllm.capture.connector",
            "kv_role": "kv_both",
        },
    )
    engine_start_s = time.perf_counter() - start
    start = time.perf_counter()
    view = shared_view(llm)
    view_build_s = time.perf_counter() - start

    text = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. " * 200
    all_ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)
    weight = hf_model.get_input_embeddings().weight
    rows_per_length = []
    for length in args.lengths:
        ids = all_ids[:length]
        rows = weight[ids]
        prefill_state(llm, view, tokenizer, ids)  # warm-up
        _cache.prefill(hf_model, rows)
        capture_s = _median_seconds(lambda: prefill_state(llm, view, tokenizer, ids), args.repeats)
        hf_prefill_s = _median_seconds(lambda: _cache.prefill(hf_model, rows), args.repeats)
        view_prefill_s = _median_seconds(lambda: _cache.prefill(view, rows), args.repeats)
        rows_per_length.append(
            {
                "positions": int(length),
                "vllm_capture_s": round(capture_s, 4),
                "hf_prefill_s": round(hf_prefill_s, 4),
                "view_prefill_s": round(view_prefill_s, 4),
                "capture_over_hf": round(capture_s / hf_prefill_s, 2),
            }
        )
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "benchmark": "vllm_capture",
                "model": "embedded (SmolLM2-135M-Instruct, float32)",
                "vllm": vllm.__version__,
                "torch": torch.__version__,
                "cpu": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                "repeats": args.repeats,
                "hf_load_s": round(hf_load_s, 3),
                "engine_start_s": round(engine_start_s, 3),
                "view_build_s": round(view_build_s, 3),
                "lengths": rows_per_length,
                "peak_rss_mib": round(peak_rss_mib, 1),
            },
            indent=2,
        )
    )
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
