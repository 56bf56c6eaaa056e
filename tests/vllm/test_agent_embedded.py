"""Agents on the embedded SmolLM2-135M: HF and vLLM backends select, deliver and generate alike."""

from __future__ import annotations

import pytest
import torch

import rclc
from rclc import models
from rclc.vllm.capture import registry
from rclc.selectors import cacheback, cacheback_scores
from rclc.snapshot import model_identity
from tests.helpers.vllm_engines import running_engine, vllm

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

DOCUMENT = (
    "Project notes. The Cedar project is owned by Alice Moreau and was launched on 3 May 2021 in Oslo. "
    "It builds water sensors for mountain huts. The Birch project is owned by Bob Tanaka and was launched "
    "on 9 June 2019 in Lima; it maps bus routes. The Maple project, owned by Carla Diaz, started in 2022 "
    "in Porto and trains volunteers. Budgets: Cedar 40,000 euros, Birch 25,000 euros, Maple 12,000 euros. "
    "Alice reports to the board every quarter; Bob reports twice a year. Carla joined after Maple's pilot."
)
HISTORY = [
    {"role": "system", "content": "You are a careful assistant. Answer from the notes."},
    {"role": "user", "content": DOCUMENT},
]
QUESTION = "Who owns the Cedar project and when was it launched?"


@pytest.fixture(scope="module")
def llm():
    with running_engine(models.local_dir("embedded"), max_model_len=2048, kv_cache_memory_bytes=256 * 2**20) as engine:
        yield engine


@pytest.fixture(autouse=True)
def _registry_left_clean():
    yield
    left = registry.entries()
    for request_id in left:
        registry.discard_capture(request_id)
    assert left == {}, f"captures left in the registry: {left}"


def _greedy(inputs):
    cap = inputs["sampling_params"].max_tokens
    inputs["sampling_params"] = vllm.SamplingParams(max_tokens=cap, temperature=0.0)
    return inputs


def _hf_generate(model, inputs):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, return_dict_in_generate=True)


def test_one_identity_for_both_backends(llm, embedded):
    model, tokenizer = embedded
    agent = rclc.bind(llm, backend="vllm")
    assert model_identity(agent.model, agent.tokenizer) == model_identity(model, tokenizer)


def test_cacheback_selects_the_same_positions_on_both_backends(llm, embedded):
    model, tokenizer = embedded
    on_vllm = rclc.bind(llm, backend="vllm", messages=HISTORY).sender_state()
    on_hf = rclc.bind(model, tokenizer, messages=HISTORY).sender_state()
    assert torch.equal(on_vllm.token_ids, on_hf.token_ids)
    request = on_hf.request_ids(QUESTION)
    scores_vllm, scores_hf = cacheback_scores(on_vllm, request), cacheback_scores(on_hf, request)
    # 30 float32 layers through oneDNN vs torch GEMMs: scores agree to ~1e-4 relative.
    torch.testing.assert_close(scores_vllm, scores_hf, atol=1e-5, rtol=1e-3)
    total = on_hf.positions
    for budget in (total // 8, total // 4, total // 2):
        assert cacheback(on_vllm, request, budget) == cacheback(on_hf, request, budget)


def test_vllm_receiver_generates_the_hf_receivers_greedy_tokens(llm, embedded):
    model, tokenizer = embedded
    sender = rclc.bind(llm, backend="vllm", messages=HISTORY)
    system = [{"role": "system", "content": "Answer in one sentence."}]
    hf_receiver = rclc.bind(model, tokenizer, messages=system, max_new_tokens=16)
    vllm_receiver = rclc.bind(llm, backend="vllm", messages=system, max_new_tokens=16)
    rclc.transfer_sync(sender, [hf_receiver, vllm_receiver], QUESTION, record_selection=True)
    assert hf_receiver.peek()[0] is vllm_receiver.peek()[0]
    hf_inputs, vllm_inputs = hf_receiver.pop(), _greedy(vllm_receiver.pop())
    assert torch.equal(vllm_inputs["prompts"]["prompt_embeds"], hf_inputs["inputs_embeds"][0])
    hf_output = _hf_generate(model, hf_inputs)
    vllm_output = llm.generate(**vllm_inputs)
    tokens = list(vllm_output[0].outputs[0].token_ids)
    assert len(tokens) >= 4
    assert tokens == hf_output.sequences[0].tolist()
    vllm_receiver.update(inputs=vllm_inputs, generation=vllm_output)
    hf_receiver.update(inputs=hf_inputs, generation=hf_output)
    vllm_state, hf_state = vllm_receiver.sender_state(), hf_receiver.sender_state()
    assert torch.equal(vllm_state.token_ids, hf_state.token_ids)
    assert vllm_state.inherited_positions == hf_state.inherited_positions > 0


def test_mixed_agents_exchange_handoffs_both_ways(llm, embedded):
    model, tokenizer = embedded
    reader = rclc.bind(llm, backend="vllm", messages=HISTORY, max_new_tokens=16)
    writer = rclc.bind(model, tokenizer, messages=[{"role": "system", "content": "Be brief."}], max_new_tokens=16)
    rclc.transfer_sync(reader, writer, QUESTION)
    inputs = writer.pop()
    writer.update(inputs=inputs, generation=_hf_generate(model, inputs))
    rclc.transfer_sync(writer, reader, "Repeat the owner's name.")
    inputs = _greedy(reader.pop())
    output = llm.generate(**inputs)
    reader.update(inputs=inputs, generation=output)
    state = reader.sender_state()
    assert state.positions == inputs["prompts"]["prompt_embeds"].shape[0] + len(output[0].outputs[0].token_ids)
    rclc.transfer_sync(reader, writer, QUESTION)
    assert len(writer) == 1
