"""Time the latent rollout, snapshot save/load and the identity hash on the embedded model.

Prints one JSON object. Usage: python benchmarks/reasoning_snapshot.py [--steps 40] [--prompt-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from rclc import models, snapshot
from rclc._cache import prefill
from rclc.reasoning import latent_mass_sync
from rclc.state import SenderState


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    options = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = models.load("embedded")
    weight = model.get_input_embeddings().weight
    ids = torch.randint(0, weight.shape[0], (options.prompt_tokens,), generator=torch.Generator().manual_seed(0))
    rows = weight[ids].detach().clone()
    prefill(model, rows[:16])  # warm-up: first forwards pay one-off kernel selection
    cache, prefill_s = timed(prefill, model, rows)
    state = SenderState(model, cache, rows, tokenizer, ids)
    _, rollout_s = timed(latent_mass_sync, state, steps=options.steps)
    _, request_rollout_s = timed(latent_mass_sync, state, steps=options.steps, request="Who owns Cedar?")
    identity, first_hash_s = timed(snapshot.model_identity, model, tokenizer)
    _, cached_hash_s = timed(snapshot.model_identity, model, tokenizer)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.safetensors"
        _, write_s = timed(snapshot.write_snapshot, path, state, identity)
        contents, read_s = timed(snapshot.read_snapshot, path, model, tokenizer, context_limit=8192)
        _, restore_s = timed(snapshot.restore_state, model, tokenizer, *contents)
        size = path.stat().st_size
    print(
        json.dumps(
            {
                "model": "embedded SmolLM2-135M fp32, CPU, 2 threads",
                "prompt_tokens": options.prompt_tokens,
                "steps": options.steps,
                "prefill_s": round(prefill_s, 4),
                "rollout_s": round(rollout_s, 4),
                "rollout_ms_per_step": round(1000 * rollout_s / options.steps, 2),
                "rollout_with_request_s": round(request_rollout_s, 4),
                "identity_first_s": round(first_hash_s, 4),
                "identity_cached_s": round(cached_hash_s, 4),
                "snapshot_write_s": round(write_s, 4),
                "snapshot_read_s": round(read_s, 4),
                "snapshot_restore_s": round(restore_s, 4),
                "snapshot_bytes": size,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
