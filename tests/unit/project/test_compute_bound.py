"""benchmarks/compute_bound.py (issue 28): the arithmetic it attributes to a forward must be
the model's, and its timings must time the forwards it names, on a tiny model of each family:
decode steps through the engine's store one position at a time, without reallocating it, and
a side-by-side rate from every thread it starts."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from tests.helpers.benchmarks import load_benchmark


def _benchmark():
    return load_benchmark("compute_bound")


def _config(**changes):
    values = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
              "intermediate_size": 16, "num_hidden_layers": 3, "vocab_size": 50}
    return SimpleNamespace(**(values | changes))


def test_row_flops_counts_projections_mlp_and_attention_per_layer():
    # per layer: q and o 8*2*4 each, k and v 8*1*4 each (192 weights), gate/up/down 3*8*16 (384);
    # attention over 10 keys: scores and mix, 2*2*4*10 (160); two operations per multiply-add
    assert _benchmark().row_flops(_config(), context=10) == 3 * 2 * (192 + 384 + 160)


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads():
    module = _benchmark()
    explicit = module.row_flops(_config(head_dim=4, num_key_value_heads=2), context=0)
    implied = module.row_flops(_config(head_dim=None, num_key_value_heads=None), context=0)
    assert implied == explicit


def test_head_flops_is_one_product_over_the_vocabulary():
    assert _benchmark().head_flops(_config()) == 2 * 8 * 50


def test_weight_bytes_counts_a_tied_parameter_once():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embed": embedding, "head": head})
    assert _benchmark().weight_bytes(model) == 10 * 4 * 4


def test_measure_times_prefills_and_decode_steps_of_a_tiny_model(tiny):
    model, _ = tiny
    report = _benchmark().measure(model, prefill_shapes=[(2, 8)], decode_batches=[1, 3], context=6, repeats=1,
                                  side_by_side=(1, 2))
    prefill, = report["prefill"]
    assert (prefill["batch"], prefill["rows"]) == (2, 8)
    assert prefill["ms_per_row"] > 0 and prefill["gflops"] > 0 and prefill["share_of_matmul_rate"] > 0
    assert [step["batch"] for step in report["decode"]] == [1, 3]
    for step in report["decode"]:
        assert step["ms_per_step"] > 0
        assert step["ms_per_token"] == pytest.approx(step["ms_per_step"] / step["batch"], abs=0.01)
    assert report["matmul_gflops"]["square_1024"] > 0
    assert [(entry["threads"], entry["batch"], entry["rows"]) for entry in report["prefill_side_by_side"]] == [
        (1, 2, 8), (2, 2, 8)]
    assert all(entry["cpu_ms_per_row"] > 0 for entry in report["prefill_side_by_side"])


def test_side_by_side_runs_every_threads_forwards(tiny, monkeypatch):
    model, _ = tiny
    module = _benchmark()
    decoder = module.backbone(model)
    calls = []  # the thread of each forward, in the order they began
    forward = type(decoder).forward

    def recording(self, *args, **kwargs):
        # the Thread object, not get_ident(): an ended thread's identifier can be given to the
        # next thread started, so identifiers would undercount threads that did not overlap
        calls.append(threading.current_thread())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(decoder), "forward", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # a process whose torch runs two threads per forward
    try:
        result = module.side_by_side_rate(model, batch=1, rows=4, width=3, repeats=2)
        # its workers' one thread each does not leak into the process (later tests' numerics)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert result["threads"] == 3 and len(set(calls)) == 3  # three threads, each forwarding
    assert len(calls) == 3 * (1 + 2)  # a warm-up and two timed forwards each
    # no timed forward began before every thread's warm-up: the timed ones ran side by side
    assert len(set(calls[:3])) == 3


def test_decode_steps_the_engines_store_one_position_at_a_time_without_copying_it(tiny, monkeypatch):
    model, _ = tiny
    module = _benchmark()
    seen = []
    step = module.decode_step

    def recording(model, store, tokens, right_room):
        seen.append((len(tokens), list(store.lengths), store.keys[0].data_ptr()))
        return step(model, store, tokens, right_room)

    monkeypatch.setattr(module, "decode_step", recording)
    module.decode_rate(model, batch=2, context=5, repeats=3)
    assert [count for count, _, _ in seen] == [2] * 4  # a warm-up and three timed steps, two rows each
    assert [lengths for _, lengths, _ in seen] == [[5, 5], [6, 6], [7, 7], [8, 8]]
    assert len({pointer for _, _, pointer in seen}) == 1  # room was made up front: no step reallocated


def test_weight_products_time_every_kernel_over_every_weight_once(tiny):
    """Each pass multiplies by every distinct weight matrix (the tied head once), at each row
    count asked for, and says for each other kernel whether it computes what `linear` does."""
    model, _ = tiny
    module = _benchmark()
    weights = module.product_weights(model)
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert len(weights) == len(linears)
    threads = torch.get_num_threads()
    entries = module.weight_products(model, [1, 3], repeats=1)
    assert torch.get_num_threads() == threads  # the two-thread pass leaves the caller's count as it was
    assert [entry["rows"] for entry in entries] == [1, 3]
    for entry in entries:
        assert entry["linear_ms"] > 0 and entry["linear_two_threads_ms"] > 0
        for kernel in ("mkl_packed", "onednn"):
            if f"{kernel}_ms" in entry:
                assert entry[f"{kernel}_ms"] > 0 and isinstance(entry[f"{kernel}_equals_linear"], bool)
