"""Bound agents on a vLLM engine: transfer both ways with HF agents, the lifecycle, the errors.

One engine (a tiny random Llama, head size 64) serves the module; the HF agents load the
same safetensors directory, so both backends run identical weights.
"""

from __future__ import annotations

import functools
import inspect

import anyio
import pytest
import torch

import rclc
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc import _cache, models, testing
from rclc.backends import Backend, VLLMBackend
from rclc.selectors import cacheback, cacheback_scores
from rclc.snapshot import model_identity
from rclc.vllm import request_capture, shared_view
from rclc.vllm.capture import registry
from rclc.vllm.engine import engine_tokenizer
from tests.helpers.vllm_engines import running_engine, save_tiny, vllm

pytestmark = pytest.mark.vllm

ATOL = 1e-5
DOCUMENT = (
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. "
    "The Birch project is owned by Bob and launched on 9 June 2019 in Lima. "
) * 3
HISTORY = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": DOCUMENT},
]
QUESTION = "Who owns Cedar? When did Birch launch?"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama-h64-agents")
    save_tiny(directory, "llama")
    return directory


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return models.load(str(tiny_dir))


@pytest.fixture(scope="module")
def llm(tiny_dir):
    with running_engine(tiny_dir) as engine:
        yield engine


@pytest.fixture(autouse=True)
def _clean_registry_and_idle_engine(request):
    yield
    left = registry.entries()
    for request_id in left:
        registry.discard_capture(request_id)
    assert left == {}, f"captures left in the registry: {left}"
    if "llm" in request.fixturenames:
        assert not request.getfixturevalue("llm").llm_engine.has_unfinished_requests()


def _vllm(llm, **options):
    options.setdefault("max_new_tokens", 8)
    return rclc.bind(llm, backend="vllm", **options)


def _hf(hf, **options):
    model, tokenizer = hf
    options.setdefault("max_new_tokens", 8)
    return rclc.bind(model, tokenizer, **options)


def _greedy(inputs):
    """The same inputs with greedy sampling (editing sampling_params within the cap is allowed)."""
    cap = inputs["sampling_params"].max_tokens
    inputs["sampling_params"] = vllm.SamplingParams(max_tokens=cap, temperature=0.0)
    return inputs


def _vllm_generate(llm, inputs):
    return llm.generate(**_greedy(inputs))


def _hf_generate(model, inputs):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, return_dict_in_generate=True)


def _assert_state_close(state, reference):
    torch.testing.assert_close(state.input_embeds, reference.input_embeds, atol=0, rtol=0)
    assert torch.equal(state.token_ids.cpu(), reference.token_ids.cpu())
    assert (state.inherited_positions, state.latent_steps) == (reference.inherited_positions, reference.latent_steps)
    for (keys, values), (ref_keys, ref_values) in zip(
        _cache.cache_layers(state.past_key_values), _cache.cache_layers(reference.past_key_values)
    ):
        torch.testing.assert_close(keys, ref_keys, atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(values, ref_values, atol=ATOL, rtol=1e-5)


def _run(async_function, *args, **kwargs):
    return anyio.run(functools.partial(async_function, *args, **kwargs))


# -- binding ----------------------------------------------------------------------------


def test_binding_takes_the_engine_view_tokenizer_and_limits(llm, hf):
    agent = _vllm(llm, messages=HISTORY)
    assert agent.engine is llm and agent.backend == "vllm"
    assert agent.model is shared_view(llm) and agent.tokenizer is engine_tokenizer(llm)
    assert agent.context_limit == 512  # min(max_model_len 512, max_position_embeddings 2048)
    assert _vllm(llm, context_limit=100).context_limit == 100
    with pytest.raises(ValueError, match="context_limit: 600 exceeds the engine's limit of 512"):
        _vllm(llm, context_limit=600)
    _vllm(llm, tokenizer=hf[1])  # the checkpoint's own tokenizer has the same vocabulary
    with pytest.raises(ValueError, match="vocabulary differs from the engine's"):
        rclc.bind(llm, testing.tiny_tokenizer(vocab_size=300), backend="vllm")
    with pytest.raises(ValueError, match="expected a vllm.LLM"):
        rclc.bind(hf[0], backend="vllm")
    assert registry.entries() == {}  # binding with messages captures nothing yet
    assert agent.inspect()["cached_positions"] == 0


def test_prompt_binding_captures_at_once_and_history_recaptures_only_on_change(llm, hf):
    model, tokenizer = hf
    ids = tokenizer(DOCUMENT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    agent = _vllm(llm, prompt=ids)
    assert agent.inspect()["state_source"] == "retained" and agent.inspect()["cached_positions"] == ids.shape[1]
    _assert_state_close(agent.sender_state(), rclc.sender_from_hf(model, tokenizer, ids))
    history = list(HISTORY)
    by_history = _vllm(llm, messages=history)
    first = by_history.sender_state()
    assert by_history.sender_state() is first  # unchanged history: no new capture
    history.append({"role": "assistant", "content": "Alice."})
    second = by_history.sender_state()
    assert second is not first and second.positions > first.positions
    _assert_state_close(second, rclc.sender_from_hf(model, tokenizer, history))


# -- selection and delivery on both backends ---------------------------------------------


def test_cacheback_selects_the_same_positions_on_both_backends(llm, hf):
    model, tokenizer = hf
    ids = tokenizer(DOCUMENT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    request = tokenizer(QUESTION, add_special_tokens=False, return_tensors="pt")["input_ids"]
    on_vllm = _vllm(llm, prompt=ids).sender_state()
    on_hf = rclc.sender_from_hf(model, tokenizer, ids)
    scores_vllm, scores_hf = cacheback_scores(on_vllm, request), cacheback_scores(on_hf, request)
    torch.testing.assert_close(scores_vllm, scores_hf, atol=1e-6, rtol=1e-4)
    for budget in (8, 24, 40):
        assert cacheback(on_vllm, request, budget) == cacheback(on_hf, request, budget)
    # And through transfer, with the default r4 budget, into one receiver of each kind.
    vllm_sender, hf_sender = _vllm(llm, prompt=ids), _hf(hf, prompt=ids)
    receivers = [_hf(hf), _vllm(llm)]
    for sender in (vllm_sender, hf_sender):
        rclc.transfer_sync(sender, receivers, QUESTION, record_selection=True)
    kept = [[receiver.peek(i)[0].messages[0].selection.indices for i in range(2)] for receiver in receivers]
    assert kept[0][0] == kept[0][1] == kept[1][0] == kept[1][1]


def test_latent_reasoning_on_a_vllm_sender_matches_hf(llm, hf):
    """Reasoning runs on the engine's view; the delivered rows equal the HF sender's."""
    model, tokenizer = hf
    reasoning = functools.partial(rclc.latent_mass, steps=2)
    receiver = _hf(hf)
    for sender in (_vllm(llm, prompt=DOCUMENT), _hf(hf, prompt=DOCUMENT)):
        rclc.transfer_sync(sender, receiver, QUESTION, reasoning=reasoning, record_selection=True)
    (on_vllm, _), (on_hf, _) = receiver.peek(0), receiver.peek(1)
    assert on_vllm.messages[0].selection.indices == on_hf.messages[0].selection.indices
    torch.testing.assert_close(on_vllm.messages[0].continuous_rows, on_hf.messages[0].continuous_rows, atol=1e-4, rtol=1e-4)


def test_vllm_receiver_generates_the_hf_receivers_greedy_tokens(llm, hf):
    model, tokenizer = hf
    sender = _hf(hf, messages=HISTORY)
    hf_receiver, vllm_receiver = _hf(hf, max_new_tokens=12), _vllm(llm, max_new_tokens=12)
    rclc.transfer_sync(sender, [hf_receiver, vllm_receiver], QUESTION)
    assert hf_receiver.peek()[0] is vllm_receiver.peek()[0]  # one shared delivery
    hf_inputs, vllm_inputs = hf_receiver.pop(), vllm_receiver.pop()
    assert set(vllm_inputs) == {"prompts", "sampling_params", "use_tqdm"}
    assert set(vllm_inputs["prompts"]) == {"prompt_embeds"} and vllm_inputs["use_tqdm"] is False
    rows = vllm_inputs["prompts"]["prompt_embeds"]
    assert rows.device.type == "cpu" and torch.equal(rows, hf_inputs["inputs_embeds"][0])
    assert vllm_inputs["sampling_params"].max_tokens == hf_inputs["max_new_tokens"] == 12
    hf_output = _hf_generate(model, hf_inputs)
    vllm_output = _vllm_generate(llm, vllm_inputs)
    assert list(vllm_output[0].outputs[0].token_ids) == hf_output.sequences[0].tolist()
    hf_receiver.update(inputs=hf_inputs, generation=hf_output)
    vllm_receiver.update(inputs=vllm_inputs, generation=vllm_output)
    _assert_state_close(vllm_receiver.sender_state(), hf_receiver.sender_state())


def test_mixed_agents_exchange_handoffs_both_ways(llm, hf):
    model, tokenizer = hf
    vllm_agent = _vllm(llm, messages=HISTORY, max_new_tokens=6)
    hf_agent = _hf(hf, messages=[{"role": "system", "content": "You answer briefly."}], max_new_tokens=6)
    assert model_identity(vllm_agent.model, vllm_agent.tokenizer) == model_identity(model, tokenizer)
    # vLLM sender -> HF receiver, HF native generation recorded.
    rclc.transfer_sync(vllm_agent, hf_agent, QUESTION)
    inputs = hf_agent.pop()
    hf_agent.update(inputs=inputs, generation=_hf_generate(model, inputs))
    hf_state = hf_agent.sender_state()
    received = hf_state.inherited_positions
    assert received > 0 and bool((hf_state.token_ids[received:] >= 0).all())
    # HF sender -> vLLM receiver, vLLM native generation recorded with update(inputs=, generation=).
    rclc.transfer_sync(hf_agent, vllm_agent, "What did you conclude?")
    received = vllm_agent.peek()[0].positions
    inputs = vllm_agent.pop()
    output = _vllm_generate(llm, inputs)
    vllm_agent.update(inputs=inputs, generation=output)
    state = vllm_agent.sender_state()
    generated = list(output[0].outputs[0].token_ids)
    assert state.token_ids[-len(generated):].tolist() == generated
    assert state.inherited_positions == received
    assert state.positions == inputs["prompts"]["prompt_embeds"].shape[0] + len(generated)
    assert bool((state.token_ids[received:] >= 0).all())  # prompt and generated IDs are known
    # The recorded vLLM continuation equals HF prefilling the same rows.
    reference = rclc.SenderState(
        model=model,
        past_key_values=_cache.prefill(model, state.input_embeds),
        input_embeds=state.input_embeds,
        tokenizer=tokenizer,
        token_ids=state.token_ids,
        inherited_positions=state.inherited_positions,
    )
    _assert_state_close(state, reference)
    # And the continuation travels onward to the HF agent again.
    rclc.transfer_sync(vllm_agent, hf_agent, QUESTION)
    assert len(hf_agent) == 1 and hf_agent.peek()[0].positions > 0


# -- lifecycle --------------------------------------------------------------------------


def test_lifecycle_pop_update_append_inputs(llm, hf):
    model, tokenizer = hf
    agent = _vllm(llm, messages=HISTORY, max_new_tokens=5)
    rclc.transfer_sync(_hf(hf, messages=HISTORY), agent, QUESTION)
    inputs = agent.pop()
    assert agent.inspect()["pending_generation"]
    with pytest.raises(ValueError, match="previous continuation is pending"):
        agent.pop()
    with pytest.raises(ValueError, match="continuation is pending"):
        agent.sender_state()
    output = _vllm_generate(llm, inputs)
    with pytest.raises(ValueError, match="generation: a continuation is pending"):
        agent.update(generation=output)
    with pytest.raises(ValueError, match="exact dictionary"):
        agent.update(inputs=dict(inputs), generation=output)
    with pytest.raises(ValueError, match="generation: required"):
        agent.update(inputs=inputs)
    with pytest.raises(ValueError, match="one prompt, got 2"):
        agent.update(inputs=inputs, generation=output + output)
    with pytest.raises(ValueError, match="RequestOutput"):
        agent.update(inputs=inputs, generation=_hf_generate(model, {"input_ids": torch.tensor([[1, 2]]), "max_new_tokens": 2}))
    other = llm.generate({"prompt_token_ids": [1, 2, 3]}, vllm.SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
    with pytest.raises(ValueError, match="its prompt has 3 positions"):
        agent.update(inputs=inputs, generation=other)
    assert agent.inspect()["pending_generation"]  # failures kept the pending continuation
    agent.update(inputs=inputs, generation=output)
    state = agent.sender_state()
    assert state.positions == inputs["prompts"]["prompt_embeds"].shape[0] + len(output[0].outputs[0].token_ids)
    # append: rendered text, re-prefilled through the engine; received rows stay continuous.
    _run(agent.append, "<|im_start|>user\nAnd Birch?<|im_end|>\n")
    appended = agent.sender_state()
    assert appended.positions > state.positions and appended.inherited_positions == state.inherited_positions
    assert torch.equal(appended.input_embeds[: state.positions], state.input_embeds)
    reference = rclc.SenderState(
        model=model, past_key_values=_cache.prefill(model, appended.input_embeds), input_embeds=appended.input_embeds,
        tokenizer=tokenizer, token_ids=appended.token_ids, inherited_positions=appended.inherited_positions,
    )
    _assert_state_close(appended, reference)
    with pytest.raises(ValueError, match="above the context limit"):
        _run(agent.append, torch.ones(1, 600, dtype=torch.int64))
    with pytest.raises(ValueError, match="chat messages"):
        _run(agent.append, [{"role": "user", "content": "x"}])
    assert agent.sender_state() is appended  # failures kept the state
    # inputs(): continue locally from the retained state.
    local = _run(agent.inputs, max_new_tokens=3)
    assert torch.equal(local["prompts"]["prompt_embeds"], appended.input_embeds)
    assert local["sampling_params"].max_tokens == 3
    generation = _vllm_generate(llm, local)
    agent.update(inputs=local, generation=generation)
    assert agent.sender_state().positions == appended.positions + len(generation[0].outputs[0].token_ids)
    with pytest.raises(ValueError, match="context space"):
        _run(agent.inputs, max_new_tokens=600)
    assert not agent.inspect()["pending_generation"]
    # update() with nothing returns to the message history.
    agent.update()
    assert agent.inspect()["state_source"] == "messages"
    assert agent.sender_state().inherited_positions == 0


def test_update_arguments_and_request_id_capture(llm, hf):
    _, tokenizer = hf
    agent = _vllm(llm, messages=HISTORY)
    before = agent.sender_state()
    ids = tokenizer(DOCUMENT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with pytest.raises(ValueError, match="past_key_values: vLLM agents hold no HF cache"):
        agent.update(ids, past_key_values=object())
    with pytest.raises(ValueError, match="generation: a vLLM generation is recorded only"):
        agent.update(generation=object())
    with pytest.raises(ValueError, match="needs the exact captured prompt"):
        agent.update(request_id="nothing")
    with pytest.raises(RuntimeError, match="no capture for request"):
        agent.update(ids, request_id="never-registered")
    with pytest.raises(ValueError, match="backend='vllm' only"):
        _hf(hf, request_id="x")
    assert agent.sender_state() is before
    # A capture the user's own loop made is consumed instead of prefilling again.
    engine = llm.llm_engine
    params = vllm.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    internal = engine.add_request("user-loop", {"prompt_token_ids": ids[0].tolist()}, params)
    request_capture(internal)
    while engine.has_unfinished_requests():
        engine.step()
    with pytest.raises(ValueError, match="capture holds"):
        agent.update(ids[:, :-1], request_id=internal)
    assert registry.entries() == {internal: "captured"}  # failed validation keeps the entry
    agent.update(ids, request_id=internal)
    assert registry.entries() == {}
    _assert_state_close(agent.sender_state(), _vllm(llm, prompt=ids).sender_state())
    bound = _vllm(llm, prompt=ids)
    assert bound.sender_state().positions == ids.shape[1]


def test_save_and_load_across_backends(llm, hf, tmp_path):
    model, tokenizer = hf
    vllm_agent = _vllm(llm, messages=HISTORY)
    rclc.transfer_sync(_hf(hf, messages=HISTORY), vllm_agent, QUESTION)
    inputs = vllm_agent.pop()
    vllm_agent.update(inputs=inputs, generation=_vllm_generate(llm, inputs))
    saved = vllm_agent.sender_state()
    path = tmp_path / "agent.safetensors"
    _run(vllm_agent.save, path)
    # Same checkpoint, other backend: the identity matches and the state comes back.
    restored_hf = _hf(hf)
    _run(restored_hf.load, path)
    _assert_state_close(restored_hf.sender_state(), saved)
    restored_vllm = _vllm(llm)
    _run(restored_vllm.load, path)
    _assert_state_close(restored_vllm.sender_state(), saved)
    # An HF save loads into a vLLM agent too.
    hf_path = tmp_path / "hf.safetensors"
    _run(restored_hf.save, hf_path)
    _run(restored_vllm.load, hf_path)
    _assert_state_close(restored_vllm.sender_state(), saved)
    # Refusals keep the previous state.
    other_dir = tmp_path / "other"
    save_tiny(other_dir, "llama", seed=1)
    other_model, other_tokenizer = models.load(str(other_dir))
    foreign = rclc.bind(other_model, other_tokenizer, prompt=DOCUMENT)
    foreign_path = tmp_path / "foreign.safetensors"
    _run(foreign.save, foreign_path)
    current = restored_vllm.sender_state()
    with pytest.raises(ValueError, match="identical weights"):
        _run(restored_vllm.load, foreign_path)
    assert restored_vllm.sender_state() is current
    rclc.transfer_sync(_hf(hf, messages=HISTORY), restored_vllm, QUESTION)
    with pytest.raises(ValueError, match="queued"):
        _run(restored_vllm.save, path)
    restored_vllm.pop()
    with pytest.raises(ValueError, match="pending"):
        _run(restored_vllm.load, path)
    restored_vllm.update()  # drop the pending continuation and explicit state
    _run(restored_vllm.load, path)
    _assert_state_close(restored_vllm.sender_state(), saved)


def test_latent_snapshot_restores_its_latent_tail(llm, hf, tmp_path):
    """vLLM restores by capturing the rows as prompt embeddings; the latent count survives."""
    model, tokenizer = hf
    from rclc.snapshot import write_snapshot

    latent = rclc.latent_mass_sync(rclc.sender_from_hf(model, tokenizer, DOCUMENT), steps=3)
    path = tmp_path / "latent.safetensors"
    write_snapshot(path, latent, model_identity(model, tokenizer))
    agent = _vllm(llm)
    _run(agent.load, path)
    state = agent.sender_state()
    assert state.latent_steps == 3 and bool((state.token_ids[-3:] == -1).all())
    _assert_state_close(state, latent)


# -- Agent.generate: native generation in one call ---------------------------------------


def test_vllm_backend_implements_the_whole_contract(llm):
    assert issubclass(VLLMBackend, Backend) and not VLLMBackend.__abstractmethods__
    for name in Backend.__abstractmethods__:
        contract, implementation = getattr(Backend, name), getattr(VLLMBackend, name)
        assert list(inspect.signature(implementation).parameters) == list(inspect.signature(contract).parameters), name
    agent = _vllm(llm)
    assert isinstance(agent._backend, VLLMBackend) and agent._backend.records_by_prefill


def test_generate_equals_pop_llm_generate_update(llm, hf):
    sender = _hf(hf, messages=HISTORY)
    by_hand, in_one_call, on_hf = _vllm(llm), _vllm(llm), _hf(hf)
    rclc.transfer_sync(sender, [by_hand, in_one_call, on_hf], QUESTION)
    inputs = by_hand.pop()
    output = _vllm_generate(llm, inputs)
    by_hand.update(inputs=inputs, generation=output)
    seen = []
    result = _run(in_one_call.generate, on_token=lambda index, text: seen.append((index, text)))
    assert list(result.token_ids) == list(output[0].outputs[0].token_ids)
    assert result.text == in_one_call.tokenizer.decode(result.token_ids, skip_special_tokens=True).strip()
    # issue 24 defect D2: each piece is what the decoded text gains (no special tokens, whole characters)
    assert [index for index, _ in seen] == list(range(len(result.token_ids)))
    streamed = "".join(text for _, text in seen)
    final = in_one_call.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    assert final.startswith(streamed) and set(final[len(streamed):]) <= {"\ufffd"}
    _assert_state_close(in_one_call.sender_state(), by_hand.sender_state())
    assert len(in_one_call) == 0 and not in_one_call.inspect()["pending_generation"]
    on_hf_result = _run(on_hf.generate)
    assert on_hf_result.token_ids == result.token_ids, "both backends generate the same greedy tokens"
    _assert_state_close(in_one_call.sender_state(), on_hf.sender_state())


def test_generate_from_a_prompt_alone_equals_generate_and_update_with_ids(llm, hf):
    agent, reference = _vllm(llm, max_new_tokens=6), _vllm(llm)
    prompt = "<|im_start|>user\nWho owns Cedar?<|im_end|>\n<|im_start|>assistant\n"
    ids = agent.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    output = llm.generate(
        {"prompt_token_ids": ids.tolist()}, vllm.SamplingParams(max_tokens=6, temperature=0.0), use_tqdm=False
    )
    generated = list(output[0].outputs[0].token_ids)
    reference.update(torch.cat([ids, torch.tensor(generated, dtype=torch.int64)])[None])
    result = _run(agent.generate, prompt, refresh=True)  # vLLM continuations are prefills already
    assert list(result.token_ids) == generated
    _assert_state_close(agent.sender_state(), reference.sender_state())


def test_generate_from_state_after_append_equals_hf(llm, hf):
    """A tool loop's step on a vLLM agent: generate, append a turn, generate from the state
    it holds (vLLM prefills the rows as one prompt); HF on the same weights, reusing its
    cache, gives the same greedy tokens and the same state."""
    prompt = "<|im_start|>user\nWho owns Cedar?<|im_end|>\n<|im_start|>assistant\n"
    turn = "<|im_end|>\n<|im_start|>tool\n{\"owner\": \"Alice\"}<|im_end|>\n<|im_start|>assistant\n"

    async def steps(agent):
        first = await agent.generate(prompt, max_new_tokens=4)
        await agent.append(turn)
        held = agent.inspect()["cached_positions"]
        second = await agent.generate(from_state=True, max_new_tokens=5)
        return first, held, second

    on_vllm, on_hf = _vllm(llm), _hf(hf)
    first, held, second = _run(steps, on_vllm)
    hf_first, hf_held, hf_second = _run(steps, on_hf)
    assert (first.token_ids, held, second.token_ids) == (hf_first.token_ids, hf_held, hf_second.token_ids)
    assert on_vllm.sender_state().positions == held + second.tokens
    _assert_state_close(on_vllm.sender_state(), on_hf.sender_state())
    assert not on_vllm.inspect()["pending_generation"]


def test_sampled_generation_uses_the_seed(llm):
    prompt = "<|im_start|>user\nTell me about Birch.<|im_end|>\n<|im_start|>assistant\n"
    sampling = rclc.Sampling(temperature=1.5, top_p=0.95, seed=11)
    ids = _vllm(llm).tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = llm.generate(
        {"prompt_token_ids": ids},
        vllm.SamplingParams(max_tokens=10, temperature=1.5, top_p=0.95, seed=11),
        use_tqdm=False,
    )[0].outputs[0].token_ids
    results = [_run(_vllm(llm, max_new_tokens=10).generate, prompt, sampling=sampling) for _ in range(2)]
    assert [list(r.token_ids) for r in results] == [list(expected)] * 2


def test_generate_on_a_busy_engine_keeps_state_and_queue(llm, hf):
    agent = _vllm(llm)
    rclc.transfer_sync(_hf(hf, messages=HISTORY), agent, QUESTION)
    before = agent.inspect(selection=True)
    engine = llm.llm_engine
    busy = engine.add_request("busy-generate", {"prompt_token_ids": [1, 2, 3]}, vllm.SamplingParams(max_tokens=2))
    try:
        with pytest.raises(rclc.EngineBusyError, match="unfinished requests"):
            _run(agent.generate)
    finally:
        engine.abort_request([busy], internal=True)
        while engine.has_unfinished_requests():
            engine.step()
    assert agent.inspect(selection=True) == before and len(agent) == 1
    assert _run(agent.generate).tokens >= 1


# -- failures leave nothing behind -------------------------------------------------------


def test_busy_engine_refuses_agent_work_and_keeps_state(llm, hf):
    _, tokenizer = hf
    agent = _vllm(llm, messages=HISTORY)
    before = agent.sender_state()
    engine = llm.llm_engine
    busy = engine.add_request("busy", {"prompt_token_ids": [1, 2, 3]}, vllm.SamplingParams(max_tokens=2))
    try:
        with pytest.raises(RuntimeError, match="unfinished requests"):
            agent.sender_state()
        with pytest.raises(RuntimeError, match="unfinished requests"):
            agent.update(DOCUMENT)
        with pytest.raises(RuntimeError, match="unfinished requests"):
            _run(agent.append, " more")
        with pytest.raises(RuntimeError, match="unfinished requests"):
            _vllm(llm)
        with pytest.raises(RuntimeError, match="unfinished requests"):
            rclc.transfer_sync(agent, _hf(hf), QUESTION)
        report = rclc.check(agent)
        assert not report["ok"] and report["engine"]["idle"] is False
        assert any("unfinished requests" in issue["problem"] for issue in report["issues"])
    finally:
        engine.abort_request([busy], internal=True)
        while engine.has_unfinished_requests():
            engine.step()
    assert agent.sender_state() is before
    report = rclc.check(agent)
    assert report["ok"] and report["scope"] == "bound_agent" and report["backend"] == "vllm"
    assert report["engine"]["kv_connector"] == "RCLCCaptureConnector" and report["engine"]["idle"] is True
    assert report["engine"]["max_model_len"] == 512 and report["engine"]["enable_prefix_caching"] is False
    with pytest.raises(ValueError, match="bound agent"):
        rclc.check(agent, backend="hf")


def test_failed_capture_leaves_no_entry_and_keeps_state(llm, hf, monkeypatch):
    agent = _vllm(llm, messages=HISTORY)
    before = agent.sender_state()
    engine = llm.llm_engine
    real_step = engine.step

    def failing_step():
        real_step()
        raise RuntimeError("simulated engine failure")

    monkeypatch.setattr(engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="simulated engine failure"):
        _run(agent.append, " The end.")
    with pytest.raises(RuntimeError, match="simulated engine failure"):
        agent.update(DOCUMENT)
    monkeypatch.undo()
    assert registry.entries() == {}
    assert not engine.has_unfinished_requests()
    assert agent.sender_state() is before
    # A generation that no longer fits with the re-prefill's spare position is refused cleanly.
    tight = _vllm(llm, context_limit=512)
    rclc.transfer_sync(_hf(hf, messages=HISTORY), tight, QUESTION)
    room = 4  # a long prompt leaves exactly this many positions, all used by the output
    filler = torch.full((1, 512 - tight.peek()[0].positions - room), 5, dtype=torch.int64)
    inputs = tight.pop(prompt=filler, max_new_tokens=room)
    params = vllm.SamplingParams(max_tokens=room, temperature=0.0, ignore_eos=True)
    output = llm.generate(inputs["prompts"], params, use_tqdm=False)
    with pytest.raises(ValueError, match="one spare position"):
        tight.update(inputs=inputs, generation=output)
    assert tight.inspect()["pending_generation"] and registry.entries() == {}
