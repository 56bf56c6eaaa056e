"""Shared prompt prefixes and batched prompt prefills (issue 28): how close, and how fast.

On the embedded SmolLM2-135M (float32, CPU, one torch thread), with the readers' prompts of
`benchmarks/concurrent_runs.py`'s fanout_qa inputs (chat template, the reader's system
prompt, "Question: ...\\nDocument i:\\n..."):

- **exactness**: every prompt's KV prefilled three ways, against one causal prefill of it
  alone: over the longest prefix an earlier prompt left in the model's prefix store
  (`shared`), in a batch of its run's three prompts, right-padded, from position 0
  (`batched`), and in such a batch over the prefix the store holds (`shared_batched`).
  Reported: the largest absolute difference of any key or value, how many prompts were bit
  for bit equal, and whether CacheBack r4 (the run's question as request) keeps the same
  positions of the state; and for generation prompts (the engine's prefill) the
  largest logit difference and whether the greedy first token is the same;
- **speed**: a fan-out's three reader prompts prefilled alone and whole one after another
  (as with `shared_prefixes=False, prefill_batch=1`), batched from position 0, and batched
  over the stored prefix, interleaved A/B/C over `--repeats` runs' inputs; medians.

Run: python benchmarks/shared_prefixes.py [--runs 32] [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import rclc  # noqa: E402
from rclc import models  # noqa: E402
from rclc._cache import cache_layers, prefill  # noqa: E402
from rclc._prefix_cache import PrefixCache, common_length  # noqa: E402
from rclc._shared_prefill import _suffixes  # noqa: E402
from rclc.backends.batch_cache import prefill as engine_prefill  # noqa: E402
from rclc.selectors import cacheback  # noqa: E402
from rclc.state import SenderState  # noqa: E402

from concurrent_runs import fanout_inputs  # noqa: E402

SYSTEM = "You read part of a text. Keep what helps answer the question."  # agents/reader.yaml
ANSWERER = "Answer the question in a few words, using the text you were given."  # agents/answerer.yaml


def reader_prompts(tokenizer: Any, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """The three readers' prompts of one fanout_qa run, as the graph renders them."""
    prompts = []
    for index, document in enumerate(inputs["documents"]):
        content = f"Question: {inputs['question']}\nDocument {index}:\n{document}"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
        prompts.append(torch.tensor(rclc.encode_chat(tokenizer, messages, generation_prompt=False,
                                                     enable_thinking=False).ids))
    return prompts


def answer_prompt(tokenizer: Any, inputs: dict[str, Any]) -> torch.Tensor:
    content = f"{inputs['documents'][1]}\nQuestion: {inputs['question']}\nAnswer:"
    messages = [{"role": "system", "content": ANSWERER}, {"role": "user", "content": content}]
    return torch.tensor(rclc.encode_chat(tokenizer, messages, generation_prompt=True, enable_thinking=False).ids)


def largest(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    return max(max(float((k - k2).abs().max()), float((v - v2).abs().max())) for (k, v), (k2, v2) in zip(a, b))


def kept(model: Any, tokenizer: Any, ids: torch.Tensor, layers: Any, question: str) -> list[int]:
    rows = model.get_input_embeddings().weight[ids].detach()
    from rclc._cache import cache_from_layers

    sender = SenderState(model, cache_from_layers(model, layers), rows, tokenizer=tokenizer, token_ids=ids)
    request = sender.request_ids(question)
    return list(cacheback(sender, request, -(-int(ids.shape[0]) // 4)))


def exactness(model: Any, tokenizer: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """KV, selection and first-token agreement of shared / batched prefills with one prefill alone."""
    store = PrefixCache(128 << 20)
    figures: dict[str, dict[str, Any]] = {name: {"prompts": 0, "bit_equal": 0, "largest_difference": 0.0,
                                                 "same_selection": 0, "reused_positions": 0}
                                          for name in ("shared", "batched", "shared_batched")}
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        for run in inputs:
            prompts = reader_prompts(tokenizer, run)
            alone = [cache_layers(prefill(model, weight[ids])) for ids in prompts]
            reference = [kept(model, tokenizer, ids, layers, run["question"]) for ids, layers in zip(prompts, alone)]
            found = [store.longest(ids) for ids in prompts]
            ways = {
                "shared": [(_suffixes(model, [ids], None if hit is None else hit.layers)[0], 0 if hit is None else
                            hit.length) for ids, hit in zip(prompts, found)],
                "batched": [(layers, 0) for layers in _suffixes(model, prompts, None)],
            }
            common = min([int(p.shape[0]) - 1 for p in prompts] + [common_length(prompts[0], p) for p in prompts[1:]])
            hit = store.longest(prompts[0][: common + 1])
            ways["shared_batched"] = [(layers, 0 if hit is None else hit.length) for layers in
                                      _suffixes(model, prompts, None if hit is None else hit.layers)]
            for name, results in ways.items():
                entry = figures[name]
                for ids, (layers, reused), own, selection in zip(prompts, results, alone, reference):
                    difference = largest(layers, own)
                    entry["prompts"] += 1
                    entry["bit_equal"] += difference == 0.0
                    entry["largest_difference"] = max(entry["largest_difference"], difference)
                    entry["same_selection"] += kept(model, tokenizer, ids, layers, run["question"]) == selection
                    entry["reused_positions"] += reused
            for ids, layers in zip(prompts, alone):
                store.add(ids, layers)
        generation = {"prompts": 0, "same_first_token": 0, "largest_logit_difference": 0.0, "reused_positions": 0}
        answers = PrefixCache(128 << 20)
        for run in inputs:
            ids = answer_prompt(tokenizer, run)
            logits, layers = engine_prefill(model, ids.unsqueeze(0), None, None)
            hit = answers.longest(ids)
            if hit is not None:
                shared_logits, _ = engine_prefill(model, ids.unsqueeze(0), None, hit.layers)
                generation["prompts"] += 1
                generation["reused_positions"] += hit.length
                generation["same_first_token"] += int(shared_logits.argmax()) == int(logits.argmax())
                generation["largest_logit_difference"] = max(generation["largest_logit_difference"],
                                                             float((shared_logits - logits).abs().max()))
            answers.add(ids, layers)
    return {"readers": figures, "generation_prompts": generation}


def speed(model: Any, tokenizer: Any, inputs: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """A fan-out's three reader prompts: alone and whole, batched from 0, batched over the store."""
    weight = model.get_input_embeddings().weight
    store = PrefixCache(128 << 20)
    warm = reader_prompts(tokenizer, inputs[-1])
    with torch.no_grad():
        for ids in warm:
            store.add(ids, cache_layers(prefill(model, weight[ids])))
    times: dict[str, list[float]] = {"alone": [], "batched": [], "shared_batched": []}
    shared_positions = []

    def alone(prompts: list[torch.Tensor]) -> None:
        for ids in prompts:
            prefill(model, weight[ids])

    def batched(prompts: list[torch.Tensor]) -> None:
        _suffixes(model, prompts, None)

    def shared_batched(prompts: list[torch.Tensor]) -> None:
        hit = store.longest(prompts[0][:-1])  # the template and system prompt every run shares
        shared_positions.append(0 if hit is None else hit.length)
        _suffixes(model, prompts, None if hit is None else hit.layers)

    arms = {"alone": alone, "batched": batched, "shared_batched": shared_batched}
    with torch.no_grad():
        for repeat in range(repeats):
            prompts = reader_prompts(tokenizer, inputs[repeat % len(inputs)])
            order = list(arms)[repeat % 3:] + list(arms)[: repeat % 3]
            for name in order:
                began = time.perf_counter()
                arms[name](prompts)
                times[name].append(time.perf_counter() - began)
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    return {
        "prompt_positions": [int(p.shape[0]) for p in reader_prompts(tokenizer, inputs[0])],
        "stored_prefix_positions_median": statistics.median(shared_positions),
        **{f"{name}_ms": round(value, 1) for name, value in medians.items()},
        "batched_speedup": round(medians["alone"] / medians["batched"], 2),
        "shared_batched_speedup": round(medians["alone"] / medians["shared_batched"], 2),
        "each_repeat_ms": {name: [round(v * 1e3, 1) for v in values] for name, values in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="fanout_qa inputs compared for exactness")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-exactness", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = models.load("embedded")
    inputs = fanout_inputs(max(args.runs, args.repeats))
    report: dict[str, Any] = {"benchmark": "shared_prefixes", "model": models.EMBEDDED_CHECKPOINT, "runs": args.runs}
    report["load_average_before"] = os.getloadavg()
    report["speed"] = speed(model, tokenizer, inputs, args.repeats)
    if not args.skip_exactness:
        report["exactness"] = exactness(model, tokenizer, inputs[: args.runs])
    report |= {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
               "load_average_after": os.getloadavg()}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
