"""Capture, shared-weight view and prompt embeddings on a tiny random Llama (head size 64).

One engine serves the module. HF references load the same safetensors directory, so
both backends run identical weights; float32 throughout, tolerances are float32 ones.
"""

from __future__ import annotations

import torch

import pytest
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc import _cache, models
from rclc.vllm.capture import registry
from rclc.vllm import (
    EngineProjection,
    check_engine,
    discard_capture,
    engine_context_limit,
    get_capture,
    model_from_vllm,
    prefill_state,
    request_capture,
    require_idle,
    sender_from_vllm,
    shared_view,
    state_from_capture,
    view_state_dict,
)
from tests.helpers.vllm_engines import running_engine, save_tiny, vllm

pytestmark = pytest.mark.vllm

ATOL = 1e-5
GREEDY_ONE = dict(max_tokens=1, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama-h64")
    save_tiny(directory, "llama")
    return directory


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return models.load(str(tiny_dir))


@pytest.fixture(scope="module")
def llm(tiny_dir):
    # A small token budget per step forces chunked prefill on the long prompts below.
    with running_engine(tiny_dir, max_num_batched_tokens=64) as engine:
        yield engine


@pytest.fixture(autouse=True)
def _registry_left_clean():
    yield
    left = registry.entries()
    for request_id in left:
        registry.discard_capture(request_id)
    assert left == {}, f"captures left in the registry: {left}"


def _ids(tokenizer, repeat: int = 1) -> torch.Tensor:
    text = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. Who owns Cedar? "
    return torch.tensor(tokenizer(text * repeat)["input_ids"], dtype=torch.int64)


def _assert_kv_equal(cache, reference):
    layers, expected = _cache.cache_layers(cache), _cache.cache_layers(reference)
    assert len(layers) == len(expected)
    for (keys, values), (ref_keys, ref_values) in zip(layers, expected):
        assert keys.shape == ref_keys.shape
        torch.testing.assert_close(keys, ref_keys, atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(values, ref_values, atol=ATOL, rtol=1e-5)


def _hf_cache(hf_model, rows):
    return _cache.prefill(hf_model, rows)


def _run(llm, request_id):
    engine = llm.llm_engine
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    return [o for o in outputs if o.finished]


def test_engine_configuration_passes_the_binding_check(llm):
    assert check_engine(llm) == []
    assert engine_context_limit(llm) == 512
    require_idle(llm)


@pytest.mark.parametrize("repeat", [1, 5])  # 5: ~110 tokens in 2 chunks of 64
def test_prefill_capture_equals_hf_kv(llm, hf, repeat):
    model, tokenizer = hf
    ids = _ids(tokenizer, repeat)
    view = shared_view(llm)
    state = prefill_state(llm, view, tokenizer, ids)
    reference = _hf_cache(model, model.get_input_embeddings().weight[ids])
    _assert_kv_equal(state.past_key_values, reference)
    assert torch.equal(state.token_ids, ids)
    torch.testing.assert_close(state.input_embeds, model.get_input_embeddings().weight[ids], atol=0, rtol=0)


def test_long_prompt_over_several_blocks_and_chunks(llm, hf):
    """300 positions: three 128-token blocks, five prefill chunks of at most 64 tokens."""
    model, tokenizer = hf
    ids = _ids(tokenizer, 20)[:300]
    state = prefill_state(llm, shared_view(llm), tokenizer, ids)
    _assert_kv_equal(state.past_key_values, _hf_cache(model, model.get_input_embeddings().weight[ids]))


def test_capture_from_continuous_rows_equals_hf(llm, hf):
    model, tokenizer = hf
    ids = _ids(tokenizer)
    weight = model.get_input_embeddings().weight
    rows = weight[ids].clone()
    generator = torch.Generator().manual_seed(3)
    rows[5:9] = torch.randn(4, rows.shape[1], generator=generator) * 0.05
    mixed = ids.clone()
    mixed[5:9] = -1
    state = prefill_state(llm, shared_view(llm), tokenizer, mixed, input_embeds=rows, inherited_positions=2)
    _assert_kv_equal(state.past_key_values, _hf_cache(model, rows))
    assert state.inherited_positions == 2 and torch.equal(state.token_ids, mixed)


def test_low_level_capture_and_sender(llm, hf):
    model, tokenizer = hf
    ids = _ids(tokenizer, 2)
    engine = llm.llm_engine
    internal = engine.add_request("user-request", {"prompt_token_ids": ids.tolist()}, vllm.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    request_capture(internal)
    finished = _run(llm, internal)
    assert len(finished[0].outputs[0].token_ids) == 3  # generation is unaffected by capture
    capture = get_capture(internal)
    assert capture.length == ids.shape[0]
    sender = sender_from_vllm(llm, internal, ids)
    assert registry.entries() == {}  # released on success
    _assert_kv_equal(sender.past_key_values, _hf_cache(model, model.get_input_embeddings().weight[ids]))
    assert sender.model is shared_view(llm)
    # The engine's tokenizer serves text requests like the HF one.
    expected = tokenizer("Who owns Cedar?", add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert torch.equal(sender.request_ids("Who owns Cedar?"), expected)


def test_failed_validation_keeps_the_capture_until_discarded(llm, hf):
    model, tokenizer = hf
    ids = _ids(tokenizer)
    internal = llm.llm_engine.add_request("keep", {"prompt_token_ids": ids.tolist()}, vllm.SamplingParams(**GREEDY_ONE))
    request_capture(internal)
    _run(llm, internal)
    view = shared_view(llm)
    with pytest.raises(ValueError, match="capture holds"):
        state_from_capture(view, tokenizer, internal, ids[:-1])
    with pytest.raises(ValueError, match="inherited_positions"):
        state_from_capture(view, tokenizer, internal, ids, inherited_positions=ids.shape[0] + 1)
    assert registry.entries() == {internal: "captured"}
    discard_capture(internal)
    assert registry.entries() == {}


def test_discarded_before_scheduling_leaves_nothing(llm, hf):
    _, tokenizer = hf
    internal = llm.llm_engine.add_request("dropped", {"prompt_token_ids": _ids(tokenizer).tolist()}, vllm.SamplingParams(**GREEDY_ONE))
    request_capture(internal)
    discard_capture(internal)
    _run(llm, internal)
    assert registry.entries() == {}


def test_aborted_capture_fails_as_data_and_discards_cleanly(llm, hf):
    _, tokenizer = hf
    engine = llm.llm_engine
    ids = _ids(tokenizer, 8)  # > 64 tokens: needs several steps
    internal = engine.add_request("aborted", {"prompt_token_ids": ids.tolist()}, vllm.SamplingParams(**GREEDY_ONE))
    request_capture(internal)
    engine.step()  # first chunk only
    assert registry.entries() == {internal: "pending"}
    engine.abort_request([internal], internal=True)
    _run(llm, internal)
    assert registry.entries() == {internal: "failed"}
    with pytest.raises(RuntimeError, match="finished before its whole prompt"):
        get_capture(internal)
    discard_capture(internal)
    assert registry.entries() == {}


def test_prefill_errors_leave_no_entries_and_an_idle_engine(llm, hf):
    _, tokenizer = hf
    view = shared_view(llm)
    too_long = torch.zeros(512, dtype=torch.int64)
    with pytest.raises(ValueError, match="context limit"):
        prefill_state(llm, view, tokenizer, too_long)
    with pytest.raises(ValueError, match="token_ids"):
        prefill_state(llm, view, tokenizer, torch.tensor([1, 2, 999999]))
    with pytest.raises(ValueError, match="token_ids"):
        prefill_state(llm, view, tokenizer, torch.tensor([[1, 2]]))
    assert not llm.llm_engine.has_unfinished_requests()


def test_busy_engine_is_refused(llm, hf):
    _, tokenizer = hf
    engine = llm.llm_engine
    internal = engine.add_request("busy", {"prompt_token_ids": _ids(tokenizer).tolist()}, vllm.SamplingParams(**GREEDY_ONE))
    try:
        with pytest.raises(RuntimeError, match="unfinished requests"):
            require_idle(llm)
        with pytest.raises(RuntimeError, match="unfinished requests"):
            prefill_state(llm, shared_view(llm), tokenizer, _ids(tokenizer))
        with pytest.raises(RuntimeError, match="unfinished requests"):
            model_from_vllm(llm)
    finally:
        engine.abort_request([internal], internal=True)
        _run(llm, internal)


def _pool(llm):
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


def test_connector_never_writes_the_pool(llm, hf, monkeypatch):
    """Checksum every page tensor right before and after the connector's copy step."""
    _, tokenizer = hf
    connector = _pool(llm)
    pages = connector._pages
    assert pages is not None and len(pages) == 2
    original = connector.wait_for_save
    seen = []

    def checked_wait_for_save():
        before = [p.clone() for p in pages]
        original()
        for page, copy in zip(pages, before):
            assert torch.equal(page, copy)
        seen.append(True)

    monkeypatch.setattr(connector, "wait_for_save", checked_wait_for_save)
    state = prefill_state(llm, shared_view(llm), tokenizer, _ids(tokenizer))
    assert seen
    storages = {p.untyped_storage().data_ptr() for p in pages}
    for keys, values in _cache.cache_layers(state.past_key_values):
        assert keys.untyped_storage().data_ptr() not in storages
        assert values.untyped_storage().data_ptr() not in storages


def test_view_logits_equal_hf_and_share_engine_weights(llm, hf):
    model, tokenizer = hf
    view = model_from_vllm(llm)
    ids = _ids(tokenizer, 3)[None]
    with torch.no_grad():
        torch.testing.assert_close(view(ids).logits, model(ids).logits, atol=ATOL, rtol=1e-5)
    assert not view.training and view.config._attn_implementation == "sdpa"
    assert type(view).__name__ == "LlamaForCausalLM"
    # No weight matrix is copied: every parameter shares storage with an engine tensor,
    # and the CPU backend's packed projections run through the engine's own GEMM.
    from rclc.vllm.engine import engine_model

    engine = engine_model(llm)
    engine_storage = {t.untyped_storage().data_ptr() for t in engine.parameters()}
    for name, parameter in view.named_parameters():
        assert parameter.untyped_storage().data_ptr() in engine_storage, name
        assert not parameter.requires_grad
    projections = [m for m in view.modules() if isinstance(m, EngineProjection)]
    assert len(projections) == 7 * view.config.num_hidden_layers
    # Views must not expose the engine's own parameter objects.
    engine_ids = {id(t) for t in engine.parameters()}
    assert not any(id(p) in engine_ids for p in view.parameters())


def test_view_continuation_matches_captured_cache(llm, hf):
    """Forwarding over the captured cache with the view equals HF's cached forward."""
    model, tokenizer = hf
    ids = _ids(tokenizer)
    state = prefill_state(llm, shared_view(llm), tokenizer, ids)
    more = _ids(tokenizer)[:7]
    weight = model.get_input_embeddings().weight
    hidden_view, _ = _cache.forward_rows(state.model, _cache.view_cache(state.model, state.past_key_values), inputs_embeds=weight[more][None])
    reference = _hf_cache(model, weight[ids])
    hidden_hf, _ = _cache.forward_rows(model, reference, inputs_embeds=weight[more][None])
    torch.testing.assert_close(hidden_view, hidden_hf, atol=ATOL, rtol=1e-5)


def test_prompt_embeds_generation_equals_token_generation(llm, hf):
    model, tokenizer = hf
    ids = _ids(tokenizer, 2)
    params = vllm.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    by_ids = llm.generate({"prompt_token_ids": ids.tolist()}, params, use_tqdm=False)[0].outputs[0].token_ids
    rows = model.get_input_embeddings().weight[ids].detach()
    by_rows = llm.generate({"prompt_embeds": rows}, params, use_tqdm=False)[0].outputs[0].token_ids
    assert list(by_rows) == list(by_ids)
    # And both equal HF's greedy continuation on the same weights.
    sequence = ids.clone()
    with torch.no_grad():
        for _ in range(12):
            next_id = model(sequence[None]).logits[0, -1].argmax()
            sequence = torch.cat([sequence, next_id[None]])
    assert sequence[ids.shape[0] :].tolist() == list(by_ids)

