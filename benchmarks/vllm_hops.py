"""Per-hop latency of a two-agent exchange on HF and on vLLM (embedded model); prints JSON.

Usage (in the vLLM environment, see scripts/install_vllm_cpu.sh):
    python benchmarks/vllm_hops.py [--repeats 5] [--document-repeats 8] [--new-tokens 16]

One hop, on each backend with both agents on that backend:
  1. sender prefill: a fresh agent bound with a chat history renders and prefills it
     (HF: a forward of the history; vLLM: a capture prefill through the engine);
  2. transfer: `rclc.transfer` with CacheBack at r4 (the defaults) into a receiver
     (selection runs on the HF model / the engine's shared-weight view);
  3. receiver generation: `pop()` then native generation of exactly `--new-tokens`
     tokens, greedy (HF `model.generate`; vLLM `llm.generate`, EOS ignored);
  4. record: `update(inputs=..., generation=...)` (HF completes the generate cache;
     vLLM re-prefills prefix + completion through the engine).
The backends alternate within every repeat (order flipped each time) so drifting machine
load hits both alike; medians over repeats. The first round is a warm-up, not reported.
`--threads N` sets OMP_NUM_THREADS before torch loads (both backends then use N threads);
on a small shared machine N=1 avoids OpenMP oversubscription, which otherwise dominates.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM's own handler logs to stdout; keep stdout JSON

DOCUMENT = (
    "Project notes. The Cedar project is owned by Alice Moreau and was launched on 3 May 2021 in Oslo. "
    "It builds water sensors for mountain huts. The Birch project is owned by Bob Tanaka and was launched "
    "on 9 June 2019 in Lima; it maps bus routes. The Maple project, owned by Carla Diaz, started in 2022 "
    "in Porto and trains volunteers. "
)
QUESTION = "Who owns the Cedar project and when was it launched?"
STAGES = ("sender_prefill_s", "transfer_s", "generation_s", "record_s")


def _hop(backend: str, target, tokenizer, history, new_tokens: int) -> dict[str, float]:
    """One timed exchange; `target` is the HF model or the vLLM engine."""
    import torch
    import vllm

    import rclc

    def bind(**options):
        if backend == "vllm":
            return rclc.bind(target, backend="vllm", **options)
        return rclc.bind(target, tokenizer, **options)

    times: dict[str, float] = {}
    sender = bind(messages=history)
    receiver = bind(messages=[{"role": "system", "content": "Answer in one sentence."}], max_new_tokens=new_tokens)
    start = time.perf_counter()
    state = sender.sender_state()
    times["sender_prefill_s"] = time.perf_counter() - start
    start = time.perf_counter()
    rclc.transfer_sync(sender, receiver, QUESTION)
    times["transfer_s"] = time.perf_counter() - start
    start = time.perf_counter()
    inputs = receiver.pop()
    if backend == "vllm":
        inputs["sampling_params"] = vllm.SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        output = target.generate(**inputs)
        produced = len(output[0].outputs[0].token_ids)
    else:
        with torch.no_grad():
            output = target.generate(
                **inputs, do_sample=False, min_new_tokens=new_tokens, return_dict_in_generate=True
            )
        produced = int(output.sequences.shape[1])
    times["generation_s"] = time.perf_counter() - start
    start = time.perf_counter()
    receiver.update(inputs=inputs, generation=output)
    times["record_s"] = time.perf_counter() - start
    if produced != new_tokens:
        raise RuntimeError(f"{backend}: generated {produced} tokens, expected {new_tokens}")
    times["hop_s"] = sum(times[stage] for stage in STAGES)
    times["sender_positions"] = state.positions
    times["received_positions"] = receiver.sender_state().inherited_positions
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--document-repeats", type=int, default=8, help="copies of the notes in the sender history")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both backends")
    args = parser.parse_args()
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch
    import vllm

    from rclc import models

    hf_model, tokenizer = models.load("embedded")
    start = time.perf_counter()
    llm = vllm.LLM(
        model=str(models.local_dir("embedded")),
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
    history = [
        {"role": "system", "content": "You are a careful assistant. Answer from the notes."},
        {"role": "user", "content": DOCUMENT * args.document_repeats},
    ]
    targets = {"hf": hf_model, "vllm": llm}
    samples: dict[str, list[dict[str, float]]] = {"hf": [], "vllm": []}
    load = []
    for round_index in range(args.repeats + 1):
        order = ("hf", "vllm") if round_index % 2 == 0 else ("vllm", "hf")
        for backend in order:
            result = _hop(backend, targets[backend], tokenizer, history, args.new_tokens)
            if round_index:  # round 0 warms both paths up
                samples[backend].append(result)
        load.append(os.getloadavg()[0])

    def summary(backend: str) -> dict[str, float]:
        rows = samples[backend]
        out = {key: round(statistics.median(row[key] for row in rows), 4) for key in (*STAGES, "hop_s")}
        out["sender_positions"] = int(rows[0]["sender_positions"])
        out["received_positions"] = int(rows[0]["received_positions"])
        return out

    hf, on_vllm = summary("hf"), summary("vllm")
    print(
        json.dumps(
            {
                "benchmark": "vllm_hops",
                "model": "embedded (SmolLM2-135M-Instruct, float32)",
                "selector": "cacheback r4",
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "vllm": vllm.__version__,
                "torch": torch.__version__,
                "cpu": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "threads": torch.get_num_threads(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "load_average_1m": [round(value, 2) for value in load],
                "engine_start_s": round(engine_start_s, 3),
                "hf": hf,
                "vllm_backend": on_vllm,
                "vllm_over_hf": {key: round(on_vllm[key] / hf[key], 2) for key in (*STAGES, "hop_s")},
            },
            indent=2,
        )
    )
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
