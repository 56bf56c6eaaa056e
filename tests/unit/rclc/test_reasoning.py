from __future__ import annotations

import copy
import functools
import threading
import time

import anyio
import pytest
import torch

from rclc import sender_from_hf, testing, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone, cache_from_layers, cache_layers, prefill
from rclc._worker import stop_requested  # the worker's stop flag: the hook waits for it, not for a time
from rclc.reasoning import (
    apply_reasoning,
    is_builtin_reasoning,
    latent_mass,
    latent_mass_sync,
    private_copy,
    selected_state,
    validate_reasoning_result,
)
from rclc.state import SenderState

LENGTH = 12


def make_state(model, tokenizer, *, length=LENGTH, with_ids=True, latent=0, inherited=0, seed=0):
    """A sender whose rows are token embeddings (plus `latent` trailing random rows)."""
    weight = model.get_input_embeddings().weight
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, weight.shape[0], (length,), generator=generator)
    rows = weight[ids].detach().clone()
    if latent:
        rows[-latent:] = torch.randn(latent, weight.shape[1], generator=generator).to(rows.dtype)
        ids[-latent:] = -1
    return SenderState(
        model=model,
        past_key_values=prefill(model, rows),
        input_embeds=rows,
        tokenizer=tokenizer,
        token_ids=ids if with_ids else None,
        latent_steps=latent,
        inherited_positions=inherited,
    )


def frozen_copy(state):
    """Independent clones of everything that must stay bit-identical."""
    return {
        "rows": state.input_embeds.clone(),
        "ids": None if state.token_ids is None else state.token_ids.clone(),
        "cache": [(k.clone(), v.clone()) for k, v in cache_layers(state.past_key_values)],
        "cache_objects": [(k, v) for k, v in cache_layers(state.past_key_values)],
        "counts": (state.latent_steps, state.inherited_positions),
        "cache_object": state.past_key_values,
    }


def assert_unchanged(state, before):
    assert torch.equal(state.input_embeds, before["rows"])
    if before["ids"] is None:
        assert state.token_ids is None
    else:
        assert torch.equal(state.token_ids, before["ids"])
    assert state.past_key_values is before["cache_object"]
    for (k, v), (k0, v0), (ko, vo) in zip(
        cache_layers(state.past_key_values), before["cache"], before["cache_objects"]
    ):
        assert k is ko and v is vo
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert (state.latent_steps, state.inherited_positions) == before["counts"]


def reference_rollout(model, rows, request_rows, steps):
    """Independent arithmetic: recompute every step from scratch with no cache at all."""
    weight = model.get_input_embeddings().weight
    target = weight.float().norm(dim=-1).mean().to(weight.dtype)
    sequence = torch.cat([rows, request_rows], dim=0)
    produced = []
    with torch.no_grad():
        for _ in range(steps):
            hidden = backbone(model)(inputs_embeds=sequence.unsqueeze(0), use_cache=False).last_hidden_state[0, -1]
            row = hidden / hidden.norm().clamp_min(1e-6) * target
            produced.append(row)
            sequence = torch.cat([sequence, row.unsqueeze(0)], dim=0)
    return torch.stack(produced)


def assert_cache_close(cache, expected_cache, atol=2e-5):
    got, expected = cache_layers(cache), cache_layers(expected_cache)
    assert len(got) == len(expected)
    for (k, v), (k0, v0) in zip(got, expected):
        assert k.shape == k0.shape and v.shape == v0.shape
        torch.testing.assert_close(k, k0, atol=atol, rtol=1e-4)
        torch.testing.assert_close(v, v0, atol=atol, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# latent_mass arithmetic


@pytest.mark.parametrize("with_ids", [True, False])
def test_rollout_without_request_matches_reference(tiny, with_ids):
    model, tokenizer = tiny
    state = make_state(model, tokenizer, with_ids=with_ids, inherited=3)
    before = frozen_copy(state)
    steps = 5
    result = latent_mass_sync(state, steps=steps)

    assert_unchanged(state, before)
    assert result is not state
    assert result.positions == LENGTH + steps
    assert torch.equal(result.input_embeds[:LENGTH], before["rows"])
    expected = reference_rollout(model, before["rows"], before["rows"][:0], steps)
    torch.testing.assert_close(result.input_embeds[LENGTH:], expected, atol=1e-4, rtol=1e-4)
    # The first T positions of the returned cache are the sender's own K/V, bit for bit
    # (the re-forwarded last row's K/V were replaced by the originals).
    for (k, v), (k0, v0) in zip(cache_layers(result.past_key_values), before["cache"]):
        assert torch.equal(k[..., :LENGTH, :], k0) and torch.equal(v[..., :LENGTH, :], v0)
    assert_cache_close(result.past_key_values, prefill(model, result.input_embeds))
    assert result.latent_steps == steps
    assert result.inherited_positions == 3
    assert result.model is model and result.tokenizer is tokenizer
    if with_ids:
        assert torch.equal(result.token_ids[:LENGTH], before["ids"])
        assert result.token_ids[LENGTH:].tolist() == [-1] * steps
    else:
        assert result.token_ids is None
    result.validate()


def test_rollout_norm_matches_the_embedding_target(tiny):
    model, tokenizer = tiny
    state = make_state(model, tokenizer)
    result = latent_mass_sync(state, steps=3)
    target = model.get_input_embeddings().weight.float().norm(dim=-1).mean()
    norms = result.input_embeds[LENGTH:].float().norm(dim=-1)
    torch.testing.assert_close(norms, target.expand(3), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("request_kind", ["ids", "text"])
def test_rollout_with_request_replays_rows_densely(tiny, request_kind):
    model, tokenizer = tiny
    state = make_state(model, tokenizer, latent=2)
    before = frozen_copy(state)
    weight = model.get_input_embeddings().weight
    request_ids = tokenizer("Who owns Cedar?", add_special_tokens=False, return_tensors="pt")["input_ids"]
    request = request_ids if request_kind == "ids" else "Who owns Cedar?"
    request_before = request_ids.clone()
    steps = 4

    result = latent_mass_sync(state, steps=steps, request=request)

    assert_unchanged(state, before)
    assert torch.equal(request_ids, request_before)
    # Rows are conditioned on the request (generated after it) ...
    expected = reference_rollout(model, before["rows"], weight[request_ids[0]].detach(), steps)
    torch.testing.assert_close(result.input_embeds[LENGTH:], expected, atol=1e-4, rtol=1e-4)
    # ... but the request never enters the returned state or cache.
    assert result.positions == LENGTH + steps
    assert result.past_key_values.get_seq_length() == LENGTH + steps
    assert_cache_close(result.past_key_values, prefill(model, result.input_embeds))
    assert result.latent_steps == 2 + steps
    assert result.token_ids[LENGTH - 2 :].tolist() == [-1] * (2 + steps)
    # Request conditioning changes the rollout.
    unconditioned = latent_mass_sync(state, steps=steps)
    assert not torch.allclose(unconditioned.input_embeds[LENGTH:], result.input_embeds[LENGTH:])


def test_steps_zero_returns_the_same_object(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    assert latent_mass_sync(state, steps=0) is state
    assert latent_mass_sync(state, steps=0, request="Who owns Cedar?", max_positions=0) is state
    assert anyio.run(functools.partial(latent_mass, state, steps=0)) is state


def test_async_rollout_equals_sync(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    before = frozen_copy(state)
    sync = latent_mass_sync(state, steps=3)
    result = anyio.run(functools.partial(latent_mass, state, steps=3))
    assert_unchanged(state, before)
    assert torch.equal(result.input_embeds, sync.input_embeds)
    for (k, v), (k0, v0) in zip(cache_layers(result.past_key_values), cache_layers(sync.past_key_values)):
        assert torch.equal(k, k0) and torch.equal(v, v0)


def test_rollout_extends_an_existing_latent_tail(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    once = latent_mass_sync(state, steps=2)
    twice = latent_mass_sync(once, steps=3)
    assert twice.latent_steps == 5
    assert torch.equal(twice.input_embeds[: LENGTH + 2], once.input_embeds)
    expected = reference_rollout(model, once.input_embeds, once.input_embeds[:0], 3)
    torch.testing.assert_close(twice.input_embeds[LENGTH + 2 :], expected, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# latent_mass errors (catalogue item 23)


@pytest.mark.parametrize("steps", [-1, True, 2.0, "3", None])
def test_bad_steps(tiny_qwen3, steps):
    model, tokenizer = tiny_qwen3
    with pytest.raises(ValueError, match="steps"):
        latent_mass_sync(make_state(model, tokenizer), steps=steps)


@pytest.mark.parametrize("maximum", [-1, False, 1.0])
def test_bad_max_positions(tiny_qwen3, maximum):
    model, tokenizer = tiny_qwen3
    with pytest.raises(ValueError, match="max_positions"):
        latent_mass_sync(make_state(model, tokenizer), steps=1, max_positions=maximum)


def test_steps_above_max_positions(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    with pytest.raises(ValueError, match="max_positions"):
        latent_mass_sync(make_state(model, tokenizer), steps=3, max_positions=2)
    with pytest.raises(ValueError, match="max_positions"):
        anyio.run(functools.partial(latent_mass, make_state(model, tokenizer), steps=3, max_positions=2))


def test_rollout_beyond_context_limit(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, max_positions=16)
    state = make_state(model, tokenizer, length=12)
    request = torch.tensor([[5, 6]])
    latent_mass_sync(state, steps=2, request=request)  # 12 + 2 + 2 == 16 fits
    with pytest.raises(ValueError, match="context limit"):
        latent_mass_sync(state, steps=3, request=request)
    with pytest.raises(ValueError, match="context limit"):
        latent_mass_sync(state, steps=5)


def test_rollout_validates_the_state_and_request(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    state.past_key_values = prefill(model, state.input_embeds[:-1])
    with pytest.raises(ValueError, match="past_key_values"):
        latent_mass_sync(state, steps=1)
    good = make_state(model, tokenizer)
    with pytest.raises(ValueError, match="request"):
        latent_mass_sync(good, steps=1, request="   ")
    with pytest.raises(ValueError, match="request"):
        latent_mass_sync(good, steps=1, request=torch.tensor([[1, 2]], dtype=torch.int32))


# ---------------------------------------------------------------------------------------
# Cancellation


def test_cancel_stops_the_rollout_after_the_step_under_way(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("llama", tokenizer=tiny_tokenizer)
    state = make_state(model, tokenizer)
    before = frozen_copy(state)
    steps = 12
    calls: list[float] = []

    def slow_layer(module, args, output):
        calls.append(time.monotonic())
        # The first forward lasts until the caller's cancellation has reached the worker (its
        # stop flag), not a fixed 20 ms that a loaded machine's event loop could outlast
        # before it cancels. Bounded, so a broken stop fails the asserts below, never hangs.
        deadline = time.monotonic() + 60
        while len(calls) == 1 and not stop_requested() and time.monotonic() < deadline:
            time.sleep(0.005)

    handle = backbone(model).layers[0].register_forward_hook(slow_layer)
    observed: dict[str, object] = {}

    async def runner():
        try:
            await latent_mass(state, steps=steps)
        except anyio.get_cancelled_exc_class():
            observed["calls_at_cancel"] = len(calls)
            observed["threads"] = [t.name for t in threading.enumerate()]
            raise
        observed["finished"] = True

    async def main():
        async with anyio.create_task_group() as group:
            group.start_soon(runner)
            while not calls:
                await anyio.sleep(0.001)
            observed["calls_when_cancelled"] = len(calls)
            group.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        handle.remove()
    # The rollout stops after the forward that was under way when the caller was cancelled
    # (the worker's stop flag, checked before every forward); the worker had finished
    # before CancelledError reached the caller, and nothing ran afterwards.
    assert "finished" not in observed
    assert observed["calls_when_cancelled"] < steps + 1
    assert observed["calls_at_cancel"] == observed["calls_when_cancelled"] == 1
    time.sleep(0.05)
    assert len(calls) == observed["calls_at_cancel"]
    assert_unchanged(state, before)


# ---------------------------------------------------------------------------------------
# Helpers: builtin detection, private copies, selected re-prefill


def test_is_builtin_reasoning():
    assert is_builtin_reasoning(latent_mass)
    assert is_builtin_reasoning(latent_mass_sync)
    assert is_builtin_reasoning(functools.partial(latent_mass, steps=4))
    assert is_builtin_reasoning(functools.partial(functools.partial(latent_mass_sync, steps=4), max_positions=9))

    def custom(state, *, max_positions, request=None):
        return latent_mass_sync(state, steps=1)

    assert not is_builtin_reasoning(custom)
    assert not is_builtin_reasoning(functools.partial(custom))
    assert not is_builtin_reasoning(None)


def test_private_copy_shares_nothing_writable(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer, latent=1, inherited=2)
    before = frozen_copy(state)
    copied = private_copy(state)
    assert copied.model is model and copied.tokenizer is tokenizer
    assert (copied.latent_steps, copied.inherited_positions) == (1, 2)
    copied.validate()
    copied.input_embeds.zero_()
    copied.token_ids.fill_(-1)
    for k, v in cache_layers(copied.past_key_values):
        k.zero_()
        v.zero_()
    assert_unchanged(state, before)


def test_selected_state_reprefills_the_selection(tiny):
    model, tokenizer = tiny
    state = make_state(model, tokenizer, latent=2, inherited=3)
    picked = torch.tensor([0, 4, 5, 10, 11])
    rows, ids = state.input_embeds.index_select(0, picked), state.token_ids.index_select(0, picked)
    selected = selected_state(state, rows, ids)
    assert selected.latent_steps == 0 and selected.inherited_positions == 0
    assert selected.input_embeds is rows and selected.token_ids is ids
    assert selected.model is model and selected.tokenizer is tokenizer
    fresh = prefill(model, rows)
    for (k, v), (k0, v0) in zip(cache_layers(selected.past_key_values), cache_layers(fresh)):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    selected.validate()
    extended = latent_mass_sync(selected, steps=2)
    assert extended.latent_steps == 2 and extended.token_ids[-2:].tolist() == [-1, -1]


def test_selected_state_longer_than_context(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, max_positions=8)
    state = make_state(model, tokenizer, length=8)
    rows = torch.cat([state.input_embeds, state.input_embeds[:1]])
    with pytest.raises(ValueError, match="context limit"):
        selected_state(state, rows, None)
    with pytest.raises(ValueError, match="rows"):
        selected_state(state, state.input_embeds[:0], None)


# ---------------------------------------------------------------------------------------
# validate_reasoning_result (catalogue item 22)


@pytest.fixture
def extended(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    old = make_state(model, tokenizer, latent=1, inherited=2)
    return old, latent_mass_sync(old, steps=3)


def rebuilt(state, **changes):
    fields = dict(
        model=state.model,
        past_key_values=state.past_key_values,
        input_embeds=state.input_embeds,
        tokenizer=state.tokenizer,
        token_ids=state.token_ids,
        latent_steps=state.latent_steps,
        inherited_positions=state.inherited_positions,
    )
    fields.update(changes)
    return SenderState(**fields)


def edited_cache(state, edit):
    layers = [(k.clone(), v.clone()) for k, v in cache_layers(state.past_key_values)]
    layers = edit(layers)
    return cache_from_layers(state.model, layers)


def test_valid_results_pass(extended):
    old, new = extended
    validate_reasoning_result(old, new, 3)
    validate_reasoning_result(old, old, 0)  # appending nothing is allowed
    # A method may recompute the prefix: tiny roundoff stays within the fp32 tolerance.
    noisy = rebuilt(new, past_key_values=edited_cache(new, lambda ls: [(k * (1 + 1e-7), v) for k, v in ls]))
    validate_reasoning_result(old, noisy, 3)


def _layers_minus_one(layers):
    return layers[:-1]


def _extra_head(layers):
    k, v = layers[-1]
    layers[-1] = (torch.cat([k, k[:, :1]], dim=1), v)
    return layers


def _float64(layers):
    k, v = layers[-1]
    layers[-1] = (k, v.double())
    return layers


def _drift(layers):
    k, v = layers[0]
    k[..., 0, :] += 1e-3
    return layers


def _nonfinite_kv(layers):
    k, v = layers[-1]
    v[..., -1, :] = float("nan")
    return layers


@pytest.mark.parametrize(
    "case,match",
    [
        ("wrong_type", "must return an rclc.SenderState"),
        ("subclass", "must return an rclc.SenderState"),
        ("inconsistent", "inconsistent"),
        ("removed_rows", "removed rows"),
        ("over_allowance", "max_positions"),
        ("model", "different model"),
        ("tokenizer", "different tokenizer"),
        ("inherited", "inherited_positions"),
        ("latent", "latent_steps"),
        ("prefix_rows", "preserve the sender prefix"),
        ("nonfinite_rows", "not finite"),
        ("lost_ids", "token_ids"),
        ("changed_ids", "token_ids"),
        ("layer_count", "layers"),
        ("geometry", "shape"),
        ("dtype", "dtype"),
        ("cache_drift", "preserve the cache prefix"),
        ("nonfinite_kv", "not finite"),
    ],
)
def test_each_invalid_result_is_refused(extended, tiny_tokenizer, case, match):
    old, new = extended
    allowance = 3
    if case == "wrong_type":
        bad = {"state": new}
    elif case == "subclass":
        bad = type("Sub", (SenderState,), {})(**{f: getattr(new, f) for f in (
            "model", "past_key_values", "input_embeds", "tokenizer", "token_ids", "latent_steps",
            "inherited_positions")})
    elif case == "inconsistent":
        bad = rebuilt(new, latent_steps=new.positions)
    elif case == "removed_rows":
        old, bad = new, old
    elif case == "over_allowance":
        bad, allowance = new, 2
    elif case == "model":
        other, _ = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, seed=1)
        bad = rebuilt(new, model=other)
    elif case == "tokenizer":
        bad = rebuilt(new, tokenizer=copy.copy(new.tokenizer))
    elif case == "inherited":
        bad = rebuilt(new, inherited_positions=1)
    elif case == "latent":
        bad = rebuilt(new, latent_steps=new.latent_steps - 1)
    elif case == "prefix_rows":
        rows = new.input_embeds.clone()
        rows[0] += 1e-6
        bad = rebuilt(new, input_embeds=rows)
    elif case == "nonfinite_rows":
        rows = new.input_embeds.clone()
        rows[-1, 0] = float("inf")
        bad = rebuilt(new, input_embeds=rows)
    elif case == "lost_ids":
        bad = rebuilt(new, token_ids=None)
    elif case == "changed_ids":
        ids = new.token_ids.clone()
        ids[0] = (ids[0] + 1) % 100
        bad = rebuilt(new, token_ids=ids)
    elif case == "layer_count":
        bad = rebuilt(new, past_key_values=edited_cache(new, _layers_minus_one))
    elif case == "geometry":
        bad = rebuilt(new, past_key_values=edited_cache(new, _extra_head))
    elif case == "dtype":
        bad = rebuilt(new, past_key_values=edited_cache(new, _float64))
    elif case == "cache_drift":
        bad = rebuilt(new, past_key_values=edited_cache(new, _drift))
    elif case == "nonfinite_kv":
        bad = rebuilt(new, past_key_values=edited_cache(new, _nonfinite_kv))
    with pytest.raises(ValueError, match=match):
        validate_reasoning_result(old, bad, allowance)


def test_prefix_tolerance_depends_on_dtype(tiny_tokenizer):
    """A relative error of 4e-3 is roundoff for bfloat16 but drift for float32."""
    for dtype, accepted in (("bfloat16", True), ("float32", False)):
        model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, dtype=dtype)
        old = make_state(model, tokenizer)
        new = latent_mass_sync(old, steps=2)
        scaled = rebuilt(new, past_key_values=edited_cache(new, lambda ls: [(k * (1 + 4e-3), v) for k, v in ls]))
        if accepted:
            validate_reasoning_result(old, scaled, 2)
        else:
            with pytest.raises(ValueError, match="cache prefix"):
                validate_reasoning_result(old, scaled, 2)


# ---------------------------------------------------------------------------------------
# apply_reasoning


def run_apply(method, state, *, maximum=None, request_ids=None, request_positions=0):
    return anyio.run(
        functools.partial(
            apply_reasoning,
            method,
            state,
            maximum=maximum,
            request_ids=request_ids,
            request_positions=request_positions,
        )
    )


def test_allowance_below_zero(tiny_tokenizer):
    model, tokenizer = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, max_positions=16)
    state = make_state(model, tokenizer, length=12)
    seen = {}

    def method(state, *, max_positions, request=None):
        seen["max_positions"] = max_positions
        return state

    assert run_apply(method, state, request_positions=4) is not None
    assert seen["max_positions"] == 0
    run_apply(method, state, maximum=1, request_positions=2)
    assert seen["max_positions"] == 1
    run_apply(method, state, maximum=10, request_positions=2)
    assert seen["max_positions"] == 2
    with pytest.raises(ValueError, match="context limit"):
        run_apply(method, state, request_positions=5)


def test_builtin_partial_gets_the_state_and_is_trusted(tiny_qwen3, monkeypatch):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    before = frozen_copy(state)
    seen = {}
    real = latent_mass_sync

    def spy(given, **keywords):
        seen["given"] = given
        return real(given, **keywords)

    import rclc.reasoning as reasoning

    monkeypatch.setattr(reasoning, "validate_reasoning_result", lambda *a: pytest.fail("built-ins are trusted"))
    monkeypatch.setattr(reasoning, "latent_mass_sync", spy)
    monkeypatch.setattr(reasoning, "_BUILTINS", (reasoning.latent_mass, spy))
    result = run_apply(functools.partial(spy, steps=3), state, maximum=5)
    assert seen["given"] is state
    assert result.latent_steps == 3
    assert_unchanged(state, before)
    # The async built-in goes through the same path (worker inside latent_mass).
    result = run_apply(functools.partial(latent_mass, steps=2), state)
    assert result.positions == LENGTH + 2
    with pytest.raises(ValueError, match="max_positions"):
        run_apply(functools.partial(latent_mass, steps=6), state, maximum=5)


def test_sync_custom_method_runs_in_a_worker_on_a_private_copy(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    before = frozen_copy(state)
    request_ids = torch.tensor([[5, 6, 7]])
    seen = {}

    def method(given, *, max_positions, request=None):
        seen["thread"] = threading.get_ident()
        seen["given"] = given
        seen["request"] = request
        out = latent_mass_sync(given, steps=2, request=request)
        # Vandalize the private copy and the request after use: the caller must not notice.
        given.input_embeds.zero_()
        for k, v in cache_layers(given.past_key_values):
            k.zero_()
        request.fill_(0)
        return out

    caller = threading.get_ident()
    result = run_apply(method, state, maximum=4, request_ids=request_ids, request_positions=3)
    assert seen["thread"] != caller
    assert seen["given"] is not state
    assert seen["request"] is not request_ids
    assert request_ids.tolist() == [[5, 6, 7]]
    assert_unchanged(state, before)
    assert result.positions == LENGTH + 2


def test_async_custom_methods_run_on_the_caller_loop(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    threads = []

    async def method(given, *, max_positions, request=None):
        threads.append(threading.get_ident())
        await anyio.sleep(0)
        return await latent_mass(given, steps=1, max_positions=max_positions)

    class AsyncCallable:
        async def __call__(self, given, *, max_positions, request=None):
            threads.append(threading.get_ident())
            return await latent_mass(given, steps=2)

    def returns_awaitable(given, *, max_positions, request=None):
        return latent_mass(given, steps=3)

    caller = threading.get_ident()
    assert run_apply(method, state).latent_steps == 1
    assert run_apply(functools.partial(method), state).latent_steps == 1
    assert run_apply(AsyncCallable(), state).latent_steps == 2
    assert threads == [caller, caller, caller]
    assert run_apply(returns_awaitable, state).latent_steps == 3


def test_invalid_custom_result_is_refused(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)

    def too_many(given, *, max_positions, request=None):
        return latent_mass_sync(given, steps=max_positions + 1)

    def drops_ids(given, *, max_positions, request=None):
        out = latent_mass_sync(given, steps=1)
        out.token_ids = None
        return out

    def fails(given, *, max_positions, request=None):
        raise RuntimeError("method failed")

    with pytest.raises(ValueError, match="max_positions"):
        run_apply(too_many, state, maximum=2)
    with pytest.raises(ValueError, match="token_ids"):
        run_apply(drops_ids, state)
    with pytest.raises(RuntimeError, match="method failed"):
        run_apply(fails, state)


@pytest.mark.integration
def test_rollout_on_the_embedded_model(embedded):
    model, tokenizer = embedded
    ids = tokenizer("The Birch project is owned by Bob.", add_special_tokens=False, return_tensors="pt")["input_ids"]
    rows = model.get_input_embeddings().weight[ids[0]].detach().clone()
    state = SenderState(model, prefill(model, rows), rows, tokenizer, ids[0].clone())
    before = frozen_copy(state)
    request = "Who owns Birch?"
    result = latent_mass_sync(state, steps=4, request=request)
    assert_unchanged(state, before)
    request_rows = model.get_input_embeddings().weight[state.request_ids(request)[0]].detach()
    expected = reference_rollout(model, rows, request_rows, 4)
    torch.testing.assert_close(result.input_embeds[rows.shape[0] :], expected, atol=1e-3, rtol=1e-3)
    assert_cache_close(result.past_key_values, prefill(model, result.input_embeds), atol=1e-4)


# issue 16 item 3: custom methods get request=None when there is no request (api.md's signature)
@pytest.mark.parametrize("context", ["full", "selected"])
def test_custom_methods_always_get_the_request_keyword(tiny_qwen3, context):
    model, tokenizer = tiny_qwen3
    sender = sender_from_hf(model, tokenizer, "The Cedar project is owned by Alice.")
    seen = []

    def method(state, *, max_positions, request):  # no default: the keyword must be passed
        seen.append(request)
        return state

    options = {"reasoning_budget": 2} if context == "selected" else {}
    transfer_sync(sender, lambda delivery: None, "Who owns Cedar?", reasoning=method, reasoning_context=context,
                  budget=8, **options)
    assert seen == [None]
