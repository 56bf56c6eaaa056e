"""How close the model's forwards run to what one CPU core computes (issue 28).

Why: 32 concurrent fanout_qa runs stop short of 3x the sequential runs per minute, and the
forward profile (`forward_profile.py`) shows their concurrent phase made of prompt-sized
forwards (readers' prompts, captures, answerers' prefills) plus decode steps. Whether those
could cost less is a question of figures, not of impressions: this script takes the
arithmetic a forward needs from the model's config, times the forward at one torch thread,
and compares the rate with what a large single-precision matrix product reaches on the same
core. A prefill near that rate is compute-bound: batching more of it together saves nothing,
and only fewer rows would make it cheaper. A decode step far below it is bound by reading
the weights, which is what batching decode amortizes.

    python benchmarks/compute_bound.py                 # the embedded model, one thread
    python benchmarks/compute_bound.py --threads 2

It prints one JSON object: the matrix-product rate (a square product and one shaped like the
model's MLP), the prefill's milliseconds per row and GFLOP/s at a few batch shapes, the first
shape's CPU milliseconds per row when 1, 2 and 3 threads run it at once, a decode step's
milliseconds at several batch sizes with the weight bytes it reads per second, and
(`weight_products`) one pass of a few rows through every weight matrix of the model by the
kernels torch offers on a CPU: its own `linear` (MKL's sgemm here), the same with MKL's
weights packed once ahead, oneDNN's linear, and `linear` at two threads. Why the last part:
a decode step of 8 to 32 rows costs 2 to 5 times one of 1 row on the development CPU (an
AMD EPYC, AVX2), far from the 1x that reading the weights once would allow, and whether
another kernel narrows that decides whether the closing decode wave of concurrent runs can
get cheaper without changing the arithmetic (docs/performance.md, 2026-12-06).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rclc._cache import backbone, cache_keyword, cache_layers, new_cache  # noqa: E402
from rclc.backends.batch_cache import BatchCache, decode_step  # noqa: E402


def _dimensions(config: Any) -> tuple[int, int, int, int, int, int]:
    """hidden, heads, kv heads, head dim, MLP width, layers of a decoder config."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return hidden, heads, kv_heads, head_dim, int(config.intermediate_size), int(config.num_hidden_layers)


def row_flops(config: Any, context: float) -> float:
    """Floating-point operations one position costs through the decoder layers when it
    attends over `context` keys: the projections and the gated MLP (two per multiply-add),
    plus the attention scores and their mix over the keys. Norms, rotary embeddings and the
    softmax are left out (a few per cent at these sizes); the LM head is `head_flops`."""
    hidden, heads, kv_heads, head_dim, mlp, layers = _dimensions(config)
    projections = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    weights = projections + 3 * hidden * mlp  # gate, up, down
    attention = 2 * heads * head_dim * context  # scores, then the mix of values
    return float(layers * 2 * (weights + attention))


def head_flops(config: Any) -> float:
    """Operations of the LM head for one position (a decode step computes it for every row)."""
    return float(2 * int(config.hidden_size) * int(config.vocab_size))


def weight_bytes(model: Any) -> int:
    """Bytes of the parameters a decode step reads (tied embeddings counted once)."""
    seen: set[int] = set()
    total = 0
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel() * parameter.element_size()
    return total


def median_seconds(call: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def matmul_rate(rows: int, inner: int, columns: int, repeats: int) -> float:
    """GFLOP/s of a float32 `[rows, inner] @ [inner, columns]` product."""
    left, right = torch.randn(rows, inner), torch.randn(inner, columns)
    seconds = median_seconds(lambda: torch.mm(left, right), repeats)
    return 2 * rows * inner * columns / seconds / 1e9


def _figure(value: float) -> float:
    """A rate to three significant digits: rounding to fixed decimals would report a slow
    forward of a tiny model (a test's, on a loaded machine) as 0.0 GFLOP/s."""
    return float(f"{value:.3g}")


def _token_ids(model: Any, batch: int, rows: int, generator: torch.Generator) -> torch.Tensor:
    vocab = int(model.config.vocab_size)
    return torch.randint(min(100, vocab - 1), vocab, (batch, rows), generator=generator)


@torch.no_grad()
def prefill_rate(model: Any, batch: int, rows: int, repeats: int) -> dict[str, float]:
    """A prompt forward of `batch` x `rows` positions through the decoder (no LM head, as
    rclc's prefills run it): milliseconds per row and the GFLOP/s it reaches."""
    ids = _token_ids(model, batch, rows, torch.Generator().manual_seed(rows))
    decoder = backbone(model)
    seconds = median_seconds(lambda: decoder(input_ids=ids, use_cache=True), repeats)
    flops = batch * rows * row_flops(model.config, (rows + 1) / 2)  # causal: a row sees half the prompt on average
    return {"batch": batch, "rows": rows, "ms_per_row": round(1e3 * seconds / (batch * rows), 3),
            "gflops": _figure(flops / seconds / 1e9)}


def side_by_side_rate(model: Any, batch: int, rows: int, width: int, repeats: int) -> dict[str, float]:
    """The same prompt forward run by `width` threads at once, each at one torch thread: each
    thread's CPU milliseconds per row (median over its forwards) and the wall seconds of the
    whole. Why: concurrent runs forward two at a time on two cores; a rate measured alone
    would hide what they cost each other (shared caches and memory bandwidth), and a width
    above the cores shows what oversubscribing them costs."""
    ids = _token_ids(model, batch, rows, torch.Generator().manual_seed(rows))
    decoder = backbone(model)
    per_row: list[float] = []
    lock = threading.Lock()
    # Every worker warms up, then all start their timed forwards together: without it a fast
    # worker (a small model) could finish before the last one starts, and the rate would be
    # of forwards run one after another, not side by side.
    together = threading.Barrier(width)

    @torch.no_grad()
    def worker() -> None:
        torch.set_num_threads(1)
        try:
            decoder(input_ids=ids, use_cache=True)  # warm-up
        except BaseException:
            together.abort()  # the others stop waiting and fail too, rather than hang
            raise
        together.wait()
        for _ in range(repeats):
            began = time.thread_time()
            decoder(input_ids=ids, use_cache=True)
            with lock:
                per_row.append((time.thread_time() - began) / (batch * rows))

    threads = [threading.Thread(target=worker) for _ in range(width)]
    process_threads = torch.get_num_threads()  # a worker's set_num_threads sets the process's count
    began = time.perf_counter()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        torch.set_num_threads(process_threads)  # left as found: a caller (a test) keeps its own
    return {"threads": width, "batch": batch, "rows": rows,
            "cpu_ms_per_row": round(1e3 * statistics.median(per_row), 3),
            "wall_s": round(time.perf_counter() - began, 2)}


@torch.no_grad()
def decode_rate(model: Any, batch: int, context: int, repeats: int) -> dict[str, float]:
    """One decode step of the batching engine (`decode_step` over its left-padded store: one
    new token per row over about `context` cached positions, LM head included) at batch
    `batch`: milliseconds per step and per token, the weight bytes read per second, and the
    GFLOP/s its arithmetic comes to. The store gets room for every step up front, as the
    engine's does, so no step copies the cache; each step adds one position per row."""
    generator = torch.Generator().manual_seed(batch)
    decoder = backbone(model)
    cache = new_cache(model)
    decoder(input_ids=_token_ids(model, batch, context, generator), use_cache=True, **{cache_keyword(decoder): cache})
    steps = repeats + 1  # the warm-up too
    store = BatchCache(len(cache_layers(cache)))
    for row in range(batch):
        store.join([(keys[row : row + 1], values[row : row + 1]) for keys, values in cache_layers(cache)], steps, batch)
    tokens = _token_ids(model, 1, batch, generator)[0].tolist()
    seconds = median_seconds(lambda: decode_step(model, store, tokens, steps), repeats)
    flops = batch * (row_flops(model.config, context + steps / 2) + head_flops(model.config))
    return {"batch": batch, "ms_per_step": round(1e3 * seconds, 2), "ms_per_token": round(1e3 * seconds / batch, 2),
            "weight_gb_per_s": round(weight_bytes(model) / seconds / 1e9, 2), "gflops": _figure(flops / seconds / 1e9)}


def product_weights(model: Any) -> list[torch.Tensor]:
    """Every distinct weight matrix a decode step multiplies by: the decoder's `nn.Linear`
    layers and the LM head (tied to the embeddings: counted once)."""
    seen: set[int] = set()
    found = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            found.append(module.weight.detach())
    return found


def _mkl_packed() -> bool:
    """Whether this torch build has MKL's packed-weight linear (`torch.ops.mkl`)."""
    return bool(getattr(torch._C, "has_mkl", False)) and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")


@torch.no_grad()
def weight_products(model: Any, rows: list[int], repeats: int) -> list[dict[str, Any]]:
    """One pass of `m` rows through every weight matrix (`product_weights`), per `m` in
    `rows` and per kernel: milliseconds per pass (median), and whether each kernel's product
    equals torch's `linear` bit for bit at that `m` (a kernel that changed the arithmetic
    would change greedy outputs, so it would not be a free speed-up even if faster).

    - `linear`: `torch.nn.functional.linear`, what the model's forwards run;
    - `mkl_packed`: MKL's packed GEMM (`torch.ops.mkl._mkl_linear`), each weight packed once
      before timing (so the pass pays no packing), where the build has it;
    - `onednn`: oneDNN's linear on oneDNN tensors (what `torch.utils.mkldnn` runs), weights
      and input converted once before timing, where the build has oneDNN;
    - `linear_two_threads`: `linear` with two intra-op threads.
    """
    weights = product_weights(model)
    packed = None
    if _mkl_packed():  # packed once, for the largest row count (MKL's hint; any count may use it)
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(weight, max(rows)) for weight in weights]
    # oneDNN's weights in its own layout, converted once (the op behind torch.utils.mkldnn's
    # modules, called directly: those modules are TorchScript, which torch deprecates)
    onednn = [weight.to_mkldnn() for weight in weights] if torch.backends.mkldnn.is_available() else None
    generator = torch.Generator().manual_seed(0)
    found = []
    for count in rows:
        inputs = {width: torch.randn(count, width, generator=generator) for width in {w.shape[1] for w in weights}}
        entry: dict[str, Any] = {"rows": count}

        def run_linear() -> list[torch.Tensor]:
            return [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights]
        reference = run_linear()
        entry["linear_ms"] = round(1e3 * median_seconds(run_linear, repeats), 2)
        if packed is not None:
            def run_packed() -> list[torch.Tensor]:
                return [torch.ops.mkl._mkl_linear(inputs[w.shape[1]], p, w, None, max(rows))
                        for w, p in zip(weights, packed)]
            entry["mkl_packed_ms"] = round(1e3 * median_seconds(run_packed, repeats), 2)
            entry["mkl_packed_equals_linear"] = all(torch.equal(a, b) for a, b in zip(run_packed(), reference))
        if onednn is not None:
            onednn_inputs = {width: value.to_mkldnn() for width, value in inputs.items()}

            def run_onednn() -> list[torch.Tensor]:
                return [torch._C._nn.mkldnn_linear(onednn_inputs[w.shape[1]], o, None) for o, w in zip(onednn, weights)]
            entry["onednn_ms"] = round(1e3 * median_seconds(run_onednn, repeats), 2)
            entry["onednn_equals_linear"] = all(torch.equal(a.to_dense(), b) for a, b in zip(run_onednn(), reference))
        process_threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            entry["linear_two_threads_ms"] = round(1e3 * median_seconds(run_linear, repeats), 2)
        finally:
            torch.set_num_threads(process_threads)
        found.append(entry)
    return found


def measure(model: Any, *, prefill_shapes: list[tuple[int, int]], decode_batches: list[int], context: int,
            repeats: int, side_by_side: tuple[int, ...] = (1, 2, 3),
            product_rows: tuple[int, ...] = ()) -> dict[str, Any]:
    hidden, _, _, _, mlp, _ = _dimensions(model.config)
    square = matmul_rate(1024, 1024, 1024, repeats)
    shaped = matmul_rate(512, hidden, mlp, repeats)
    prefills = [prefill_rate(model, batch, rows, repeats) for batch, rows in prefill_shapes]
    decodes = [decode_rate(model, batch, context, repeats) for batch in decode_batches]
    together = [side_by_side_rate(model, *prefill_shapes[0], width, repeats) for width in side_by_side
                if prefill_shapes]  # the first prompt shape, run by 1, 2, ... threads at once
    peak = max(square, shaped)
    for prefill in prefills:
        prefill["share_of_matmul_rate"] = _figure(prefill["gflops"] / peak)
    return {
        "matmul_gflops": {"square_1024": round(square, 1), f"mlp_shaped_512x{hidden}x{mlp}": round(shaped, 1)},
        "row_mflops": round(row_flops(model.config, context) / 1e6, 1),
        "head_mflops": round(head_flops(model.config) / 1e6, 1),
        "weight_mb": round(weight_bytes(model) / 2**20, 1),
        "prefill": prefills,
        "prefill_side_by_side": together,
        "decode": decodes,
        "decode_context": context,
        "weight_products": weight_products(model, list(product_rows), repeats) if product_rows else [],
    }


def _pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in text.split(","):
        batch, _, rows = item.partition("x")
        pairs.append((int(batch), int(rows)))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", default="8x96,1x96,1x600",
                        help="prompt forwards to time, batch x rows (8x96: an engine batch of fanout_qa answerers;"
                             " the first is also run side by side)")
    parser.add_argument("--side-by-side", default="1,2,3", help="threads running the first prompt forward at once")
    parser.add_argument("--decode-batches", default="1,2,6,16,32")
    parser.add_argument("--context", type=int, default=150, help="cached positions under each decode row")
    parser.add_argument("--product-rows", default="1,2,4,8,16,32",
                        help="rows of the weight-product passes per kernel (empty: none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from rclc.models import load

    model, _ = load("embedded")
    report = measure(model, prefill_shapes=_pairs(args.prefill),
                     decode_batches=[int(size) for size in args.decode_batches.split(",")],
                     context=args.context, repeats=args.repeats,
                     side_by_side=tuple(int(width) for width in args.side_by_side.split(",")),
                     product_rows=tuple(int(count) for count in args.product_rows.split(",") if count))
    report = {"benchmark": "compute_bound", "model": "embedded (SmolLM2-135M-Instruct, float32)",
              "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
              "repeats": args.repeats} | report
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
