"""benchmarks/reader_memory.py counts what a sender holds (issue 28): the live-tensor figure
docs/performance.md compares RSS against must be the sender's KV and rows, each storage once."""

from __future__ import annotations

from rclc import sender_from_hf
from tests.helpers.benchmarks import load_benchmark


def _benchmark():
    return load_benchmark("reader_memory")


def test_live_bytes_is_the_senders_cache_and_rows(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, "one two three four five six seven eight")
    config = model.config
    positions = sender.input_embeds.shape[0]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * positions * 4
    rows = positions * config.hidden_size * 4
    counted = _benchmark().live_bytes(sender)
    assert counted >= kv + rows
    assert counted < 2 * (kv + rows) + 4096  # ids and small buffers, never a storage twice over
