"""Attention capture: outputs unchanged, sender untouched, dispatch always restored."""

from __future__ import annotations

import pytest
import torch

from rclc import testing
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers, forward_rows, view_cache
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors import _attention_capture as _capture
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors._attention_capture import CAPTURE_NAME, capture, reachable_configs
from tests.helpers.selector_inputs import assert_unchanged, make_sender, request, snapshot


def test_capture_folds_every_layer_with_full_keys(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    seen = []

    def fold(query, key, scaling):
        seen.append((tuple(query.shape), tuple(key.shape), scaling))

    capture(model, sender.past_key_values, fold, sender.positions, input_ids=ids)
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.head_dim
    rows, memory = ids.shape[1], sender.positions
    assert seen == [((1, heads, rows, head_dim), (1, kv_heads, memory + rows, head_dim), head_dim**-0.5)] * (
        config.num_hidden_layers
    )


def test_capture_leaves_outputs_and_sender_unchanged(tiny, monkeypatch):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    before = snapshot(sender)
    ids = request(tokenizer)
    plain, _ = forward_rows(model, view_cache(model, sender.past_key_values), input_ids=ids)

    captured = []
    original = _capture.forward_rows

    def recording(*args, **kwargs):
        hidden, cache = original(*args, **kwargs)
        captured.append(hidden)
        return hidden, cache

    monkeypatch.setattr(_capture, "forward_rows", recording)
    folds = []
    capture(model, sender.past_key_values, lambda q, k, s: folds.append(1), sender.positions, input_ids=ids)
    assert folds  # the capture really ran through the registry
    assert torch.equal(captured[0], plain)
    assert torch.equal(model.lm_head(captured[0]), model.lm_head(plain))
    assert_unchanged(sender, before)


def test_a_support_fold_computes_each_layers_output_once_within_float32_rounding(tiny, monkeypatch):
    """Issue 28: a support fold hands back each global layer's attention output from its own
    softmax (the model's kernel is not run again for it); the capture's hidden states agree
    with the plain forward's to float32 rounding, and the sender is untouched."""
    from rclc.selectors._support import SupportFold

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    before = snapshot(sender)
    ids = request(tokenizer)
    plain, _ = forward_rows(model, view_cache(model, sender.past_key_values), input_ids=ids)
    captured, kernel_calls = [], []
    original = _capture.forward_rows

    def recording(*args, **kwargs):
        hidden, cache = original(*args, **kwargs)
        captured.append(hidden)
        return hidden, cache

    monkeypatch.setattr(_capture, "forward_rows", recording)
    delegate = _capture._delegate

    def counting(config):
        entry = delegate(config)
        if entry.attention is None:
            return entry

        def attention(*args, **kwargs):
            kernel_calls.append(1)
            return entry.attention(*args, **kwargs)

        return _capture._Delegate(entry.config, attention, entry.mask)

    monkeypatch.setattr(_capture, "_delegate", counting)
    fold = SupportFold()
    capture(model, sender.past_key_values, fold, sender.positions, input_ids=ids)
    assert fold.layers == model.config.num_hidden_layers and kernel_calls == []
    torch.testing.assert_close(captured[0], plain, rtol=1e-5, atol=1e-5)
    assert_unchanged(sender, before)


def test_capture_over_a_cropped_prefix_uses_the_prefix_only(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    before = snapshot(sender)
    prefix = sender.positions - 5
    keys = []
    capture(
        model,
        sender.past_key_values,
        lambda q, k, s: keys.append(k.clone()),
        prefix,
        inputs_embeds=sender.input_embeds[prefix:].unsqueeze(0),
    )
    # Re-forwarding the last rows after the prefix rebuilds the same keys the sender cached.
    for (cached, _), key in zip(cache_layers(sender.past_key_values), keys):
        torch.testing.assert_close(key, cached, rtol=1e-5, atol=1e-6)
    assert_unchanged(sender, before)


def test_fold_error_restores_dispatch_and_propagates(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    before = snapshot(sender)

    def failing(query, key, scaling):
        raise KeyError("fold failed")

    with pytest.raises(KeyError, match="fold failed"):
        capture(model, sender.past_key_values, failing, sender.positions, input_ids=request(tokenizer))
    assert_unchanged(sender, before)
    # And the model still works normally (not through the capture functions).
    forward_rows(model, view_cache(model, sender.past_key_values), input_ids=request(tokenizer))


def test_capture_delegates_to_eager(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("llama", tokenizer=tiny_tokenizer, attn_implementation="eager")
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    plain, _ = forward_rows(model, view_cache(model, sender.past_key_values), input_ids=ids)
    folds = []
    capture(model, sender.past_key_values, lambda q, k, s: folds.append(1), sender.positions, input_ids=ids)
    assert len(folds) == model.config.num_hidden_layers
    assert model.config._attn_implementation == "eager"
    again, _ = forward_rows(model, view_cache(model, sender.past_key_values), input_ids=ids)
    assert torch.equal(plain, again)


def test_unobserved_layer_raises(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer)
    sender = make_sender(model, tokenizer)
    attention = model.model.layers[-1].self_attn
    config = attention.config

    class Stubborn(type(config)):
        """A config that keeps answering sdpa: its layer bypasses the capture."""

        @property
        def _attn_implementation(self):
            return "sdpa"

        @_attn_implementation.setter
        def _attn_implementation(self, value):
            pass

    stubborn = Stubborn.__new__(Stubborn)
    stubborn.__dict__.update(config.__dict__)
    attention.config = stubborn
    try:
        with pytest.raises(RuntimeError, match=r"layers \[1\] were not observed"):
            capture(model, sender.past_key_values, lambda q, k, s: None, sender.positions, input_ids=request(tokenizer))
    finally:
        attention.config = config
    assert model.config._attn_implementation == "sdpa"


def test_no_global_layer_raises(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer)
    sender = make_sender(model, tokenizer)
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    with pytest.raises(RuntimeError, match="no global"):
        capture(model, sender.past_key_values, lambda q, k, s: None, sender.positions, input_ids=request(tokenizer))


def test_unsupported_implementation_raises(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("llama", tokenizer=tiny_tokenizer)
    sender = make_sender(model, tokenizer)
    model.config._attn_implementation = "flash_attention_2_missing"
    with pytest.raises(RuntimeError, match="sdpa"):
        capture(model, sender.past_key_values, lambda q, k, s: None, sender.positions, input_ids=request(tokenizer))
    assert model.config._attn_implementation == "flash_attention_2_missing"


def test_other_threads_are_served_without_folding(tiny):
    """A forward of the same model from another thread during a capture gets normal outputs."""
    import threading

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    plain, _ = forward_rows(model, view_cache(model, sender.past_key_values), input_ids=ids)
    results, folds = [], []

    def other_thread():
        # call the backbone directly, as a user would (forward_rows would wait for the forward slot).
        # private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
        from rclc._cache import backbone, cache_keyword

        decoder = backbone(model)
        cache = view_cache(model, sender.past_key_values)
        memory = sender.positions
        with torch.no_grad():
            out = decoder(
                input_ids=ids,
                position_ids=torch.arange(memory, memory + ids.shape[1]).unsqueeze(0),
                attention_mask=torch.ones(1, memory + ids.shape[1], dtype=torch.long),
                use_cache=True,
                **{cache_keyword(decoder): cache},
            )
        results.append(out.last_hidden_state)

    def fold(query, key, scaling):
        if not folds:
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join()
        folds.append(1)

    capture(model, sender.past_key_values, fold, sender.positions, input_ids=ids)
    assert len(folds) == model.config.num_hidden_layers
    assert torch.equal(results[0], plain)


def test_capture_name_is_registered_once():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _capture._register()
    _capture._register()
    assert ALL_ATTENTION_FUNCTIONS[CAPTURE_NAME] is _capture._capture_attention
    assert ALL_MASK_ATTENTION_FUNCTIONS[CAPTURE_NAME] is _capture._capture_mask


def test_nested_capture_of_another_model_keeps_the_outer_capture(tiny_qwen3, tiny_llama):
    outer_model, tokenizer = tiny_qwen3
    inner_model, _ = tiny_llama
    outer_sender, inner_sender = make_sender(outer_model, tokenizer), make_sender(inner_model, tokenizer)
    ids = request(tokenizer)
    inner_folds, outer_folds = [], []

    def outer_fold(query, key, scaling):
        if not outer_folds:
            capture(
                inner_model,
                inner_sender.past_key_values,
                lambda q, k, s: inner_folds.append(1),
                inner_sender.positions,
                input_ids=ids,
            )
            assert inner_model.config._attn_implementation == "sdpa"
        outer_folds.append(1)

    capture(outer_model, outer_sender.past_key_values, outer_fold, outer_sender.positions, input_ids=ids)
    assert len(outer_folds) == outer_model.config.num_hidden_layers
    assert len(inner_folds) == inner_model.config.num_hidden_layers
    assert outer_model.config._attn_implementation == "sdpa" and _capture.active_captures() == ()


def test_nested_capture_of_the_same_model_raises_and_restores(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)

    def fold(query, key, scaling):
        capture(model, sender.past_key_values, lambda q, k, s: None, sender.positions, input_ids=ids)

    with pytest.raises(RuntimeError, match="cannot nest"):
        capture(model, sender.past_key_values, fold, sender.positions, input_ids=ids)
    assert model.config._attn_implementation == "sdpa" and _capture.active_captures() == ()


def test_a_capture_never_holds_up_the_batching_engine(tiny):
    """Issue 14: capture needs no process-global switch. While a capture of the model is
    inside its forward (its fold deliberately slow), the batching engine keeps decoding a
    generation on the same model; the generation's tokens are its unbatched ones, the
    capture folds exactly what it folds alone, and afterwards the dispatch is the model's own."""
    import threading
    import time

    import anyio

    import rclc
    from rclc.backends.hf_batching import engine_for

    model, tokenizer = tiny
    sender = make_sender(model, tokenizer)
    ids = request(tokenizer)
    expected = []
    capture(model, sender.past_key_values, lambda q, k, s: expected.append(q.clone()), sender.positions, input_ids=ids)
    prompt = "Generate while another thread captures."
    alone = anyio.run(lambda: rclc.bind(model, tokenizer).generate(prompt, max_new_tokens=40))
    assert alone.tokens > 2  # decode steps left to run during the capture
    engine = engine_for(model)
    generating = threading.Event()
    result = []

    def generate():
        def on_token(index, text):
            generating.set()
            time.sleep(0.002)

        result.append(anyio.run(lambda: rclc.bind(model, tokenizer).generate(prompt, max_new_tokens=40,
                                                                              on_token=on_token)))

    capture_began = threading.Event()
    decode_steps = []

    def engine_steps_wait_for_the_capture(module, args):
        # after its first, the engine's decode steps wait for the capture below to be inside
        # its forward, so they come during it on any machine, not all before it
        if threading.current_thread().name == "rclc-batching-decode":
            decode_steps.append(1)
            if len(decode_steps) > 1:
                capture_began.wait(30)

    # private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
    from rclc._cache import backbone

    handle = backbone(model).register_forward_pre_hook(engine_steps_wait_for_the_capture)
    worker = threading.Thread(target=generate)
    worker.start()
    assert generating.wait(30)
    folded, steps_during_fold = [], []

    def slow_fold(query, key, scaling):
        """The first fold stays inside the capture's forward until the engine has decoded a
        step (bounded: an engine held up by the capture fails the assert below)."""
        before = engine.report()["decode_steps"]
        if not capture_began.is_set():
            capture_began.set()
            deadline = time.monotonic() + 30
            while engine.report()["decode_steps"] == before and time.monotonic() < deadline:
                time.sleep(0.005)
        steps_during_fold.append(engine.report()["decode_steps"] - before)
        folded.append(query.clone())

    try:
        capture(model, sender.past_key_values, slow_fold, sender.positions, input_ids=ids)
        worker.join(60)
    finally:
        handle.remove()
    assert result and result[0].token_ids == alone.token_ids
    assert len(folded) == len(expected)
    for a, b in zip(folded, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert sum(steps_during_fold) > 0  # the engine decoded while the capture was inside its forward
    assert all(c._attn_implementation == "sdpa" for c in reachable_configs(model))
    assert _capture.active_captures() == ()
