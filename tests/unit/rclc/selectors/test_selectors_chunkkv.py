"""ChunkKV: scores against an independent eager reference, option checks and guards."""

from __future__ import annotations

import importlib

import pytest
import torch

from rclc.selectors import chunkkv, chunkkv_scores
from tests.helpers.selector_inputs import eager_attentions, eager_copy, make_sender, request

chunkkv_module = importlib.import_module("rclc.selectors.chunkkv")


def average_pool_reference(values: torch.Tensor, kernel: int) -> torch.Tensor:
    half = kernel // 2
    return torch.nn.functional.pad(values, (half, half)).unfold(-1, kernel, 1).mean(-1)


def chunkkv_reference(model, sender, chunk_size, window_size, kernel_size):
    total = sender.positions
    prefix = total - window_size
    kv_heads = model.config.num_key_value_heads
    attentions = eager_attentions(
        eager_copy(model), sender.past_key_values, prefix, inputs_embeds=sender.input_embeds[prefix:].unsqueeze(0)
    )
    summed = torch.zeros(total)
    for weights in attentions:  # [H, window, T]
        heads = weights.shape[0]
        to_prefix = weights[:, :, :prefix].mean(1)
        grouped = average_pool_reference(to_prefix, kernel_size).reshape(kv_heads, heads // kv_heads, prefix).mean(1)
        window = torch.full((kv_heads, window_size), float(grouped.max()) + 1.0)
        summed += torch.cat([grouped, window], dim=1).mean(0)
    per_position = summed / len(attentions)
    out = torch.empty(total)
    for start in range(0, total, chunk_size):
        out[start : start + chunk_size] = per_position[start : start + chunk_size].mean()
    return out


@pytest.mark.parametrize("chunk_size,window_size,kernel_size", [(16, 32, 5), (4, 8, 3), (5, 3, 1)])
def test_scores_match_the_eager_reference(tiny, chunk_size, window_size, kernel_size):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    if sender.positions <= window_size:
        pytest.skip("document shorter than the window")
    scores = chunkkv_scores(sender, chunk_size=chunk_size, window_size=window_size, kernel_size=kernel_size)
    reference = chunkkv_reference(model, sender, chunk_size, window_size, kernel_size)
    torch.testing.assert_close(scores, reference, rtol=2e-5, atol=1e-7)


def test_window_outranks_the_prefix_and_first_and_tail_are_kept(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=2)
    total = sender.positions
    kept = chunkkv(sender, request(tokenizer), 10, chunk_size=4, window_size=8)
    assert len(kept) == 10 and kept == sorted(set(kept))
    assert kept[0] == 0 and {total - 2, total - 1} <= set(kept)
    # The window's chunks score max + 1, so the rest of the budget goes to the window's end.
    assert set(range(total - 8, total)) <= set(kept)


def test_request_is_ignored(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    a = chunkkv(sender, request(tokenizer, "Cedar"), 12, chunk_size=4, window_size=8)
    b = chunkkv(sender, request(tokenizer, "Birch launched in Lima"), 12, chunk_size=4, window_size=8)
    assert a == b


def test_sender_unchanged(tiny):
    from tests.helpers.selector_inputs import assert_unchanged, snapshot

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=1)
    before = snapshot(sender)
    chunkkv(sender, request(tokenizer), 7, chunk_size=4, window_size=8)
    assert_unchanged(sender, before)


@pytest.mark.parametrize(
    "options,field",
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 2.0}, "chunk_size"),
        ({"chunk_size": True}, "span_size"),
        ({"kernel_size": 4}, "kernel_size"),
        ({"kernel_size": 0}, "kernel_size"),
        ({"kernel_size": -3}, "kernel_size"),
        ({"kernel_size": 5.0}, "kernel_size"),
        ({"window_size": 0}, "window_size"),
        ({"window_size": "8"}, "window_size"),
        ({"window_size": 10_000}, "window_size"),
    ],
)
def test_option_errors(tiny, options, field):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    with pytest.raises(ValueError, match=field):
        chunkkv(sender, request(tokenizer), 6, **options)


def test_window_as_long_as_the_state_raises(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    with pytest.raises(ValueError, match="window_size"):
        chunkkv(sender, request(tokenizer), 6, window_size=sender.positions)
    assert len(chunkkv(sender, request(tokenizer), 6, window_size=sender.positions - 1)) == 6


def test_early_exit_runs_no_forward(tiny, monkeypatch):
    # private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
    from rclc.selectors import _attention_capture as _capture

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    calls = []
    monkeypatch.setattr(_capture, "forward_rows", lambda *a, **k: calls.append(1))
    assert chunkkv(sender, request(tokenizer), sender.positions) == list(range(sender.positions))
    assert calls == []


def test_budget_below_latent_tail(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, latent_steps=3)
    with pytest.raises(ValueError, match="budget"):
        chunkkv(sender, request(tokenizer), 3, chunk_size=4, window_size=8)


def test_non_finite_scores_raise_naming_chunkkv(tiny, monkeypatch):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    nan = torch.full((sender.positions,), float("nan"))
    monkeypatch.setattr(chunkkv_module.ChunkKVFold, "scores", lambda self: nan)
    with pytest.raises(RuntimeError, match="ChunkKV"):
        chunkkv(sender, request(tokenizer), 6, chunk_size=4, window_size=8)


def test_no_layer_scored_raises():
    with pytest.raises(RuntimeError, match="no layer"):
        chunkkv_module.ChunkKVFold(5).scores()
