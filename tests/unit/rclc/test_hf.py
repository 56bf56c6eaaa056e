from __future__ import annotations

import pytest
import torch

from rclc import HFReceiver, sender_from_hf
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers, cache_length, prefill
from rclc.state import Delivery, Message

DOC = "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo."


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


def _same_cache(a, b, atol=1e-5):
    return all(
        torch.allclose(ka, kb, atol=atol) and torch.allclose(va, vb, atol=atol)
        for (ka, va), (kb, vb) in zip(cache_layers(a), cache_layers(b))
    )


def test_text_ids_and_messages_forms(tiny):
    model, tokenizer = tiny
    from_text = sender_from_hf(model, tokenizer, DOC)
    from_ids = sender_from_hf(model, tokenizer, _ids(tokenizer, DOC))
    assert torch.equal(from_text.token_ids, from_ids.token_ids)
    assert torch.equal(from_text.input_embeds, from_ids.input_embeds)
    assert cache_length(from_text.past_key_values) == from_text.positions
    chat = sender_from_hf(model, tokenizer, [{"role": "user", "content": DOC}])
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": DOC}], tokenize=False)
    assert torch.equal(chat.token_ids, _ids(tokenizer, rendered)[0])


def test_prefix_cache_is_extended_on_a_copy(tiny):
    model, tokenizer = tiny
    ids = _ids(tokenizer, DOC)
    weight = model.get_input_embeddings().weight
    prefix = prefill(model, weight[ids[0, :7]])
    before = [(k.clone(), v.clone()) for k, v in cache_layers(prefix)]
    state = sender_from_hf(model, tokenizer, ids, past_key_values=prefix)
    assert cache_length(prefix) == 7
    assert all(torch.equal(k, kb) and torch.equal(v, vb) for (k, v), (kb, vb) in zip(cache_layers(prefix), before))
    assert cache_length(state.past_key_values) == ids.shape[1]
    assert _same_cache(state.past_key_values, prefill(model, weight[ids[0]]))


def test_complete_cache_is_reused_and_longer_cache_rejected(tiny):
    model, tokenizer = tiny
    ids = _ids(tokenizer, DOC)
    full = sender_from_hf(model, tokenizer, ids)
    again = sender_from_hf(model, tokenizer, ids, past_key_values=full.past_key_values)
    assert again.past_key_values is full.past_key_values
    with pytest.raises(ValueError, match="past_key_values"):
        sender_from_hf(model, tokenizer, ids[:, :5], past_key_values=full.past_key_values)


def test_generation_form(tiny):
    model, tokenizer = tiny
    ids = _ids(tokenizer, DOC)
    output = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
        return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
    )
    state = sender_from_hf(model, tokenizer, generation=output)
    assert state.positions == output.sequences.shape[1]
    assert torch.equal(state.token_ids, output.sequences[0])
    weight = model.get_input_embeddings().weight
    assert _same_cache(state.past_key_values, prefill(model, weight[output.sequences[0]]))
    with pytest.raises(ValueError, match="generation"):
        sender_from_hf(model, tokenizer, ids, generation=output)


def test_beam_and_embeds_generations_rejected(tiny):
    model, tokenizer = tiny
    ids = _ids(tokenizer, DOC)
    beams = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, num_beams=2, do_sample=False,
        return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
    )
    with pytest.raises(ValueError, match="beam"):
        sender_from_hf(model, tokenizer, generation=beams)
    rows = model.get_input_embeddings().weight[ids[0]].unsqueeze(0)
    from_embeds = model.generate(
        inputs_embeds=rows, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
        return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
    )
    with pytest.raises(ValueError, match="inputs_embeds"):
        sender_from_hf(model, tokenizer, generation=from_embeds)


@pytest.mark.parametrize(
    "prompt,tokenizer_kind,match",
    [
        (None, "real", "prompt"),
        ([], "real", "messages"),
        ([{"role": "user", "content": "hi"}], "none", "tokenizer"),
        ("some text", "none", "tokenizer"),
        (torch.tensor([[1, 2]], dtype=torch.int32), "real", "int64"),
        (torch.tensor([[10**6]]), "real", r"\[0,"),
    ],
)
def test_sender_input_errors(tiny, prompt, tokenizer_kind, match):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=match):
        sender_from_hf(model, tokenizer if tokenizer_kind == "real" else None, prompt)


def test_prompt_above_context_limit(tiny_tokenizer):
    from rclc.testing import tiny_model

    model, tokenizer = tiny_model("llama", tokenizer=tiny_tokenizer, max_positions=8)
    with pytest.raises(ValueError, match="context limit"):
        sender_from_hf(model, tokenizer, DOC)


def test_model_refusals(tiny):
    model, tokenizer = tiny
    model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            sender_from_hf(model, tokenizer, DOC)
    finally:
        model.eval()


def _delivery(model, positions=5):
    weight = model.get_input_embeddings().weight
    return Delivery("Who owns Cedar?", (Message(weight[:positions].detach().clone()),))


def test_receiver_settings_errors(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="max_new_tokens"):
        HFReceiver(model, tokenizer, max_new_tokens=0)
    with pytest.raises(ValueError, match="context_limit"):
        HFReceiver(model, tokenizer, context_limit=10**9)
    receiver = HFReceiver(model, tokenizer, messages=[{"role": "system", "content": "Answer briefly."}])
    with pytest.raises(ValueError, match="token-ID request"):
        receiver.prepare_request(torch.tensor([[1, 2, 3]]))


def test_pop_inputs_order_and_queue(tiny):
    model, tokenizer = tiny
    receiver = HFReceiver(model, tokenizer, max_new_tokens=3)
    with pytest.raises(IndexError):
        receiver.pop()
    delivery = _delivery(model)
    receiver(delivery)
    receiver(delivery)
    assert len(receiver) == 2
    inputs = receiver.pop()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Who owns Cedar?"}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = _ids(tokenizer, prompt)
    weight = model.get_input_embeddings().weight
    expected = torch.cat([weight[:5], weight[prompt_ids[0]]])
    assert torch.equal(inputs["inputs_embeds"][0], expected)
    assert inputs["max_new_tokens"] == 3
    assert len(receiver) == 1
    out = model.generate(**inputs, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, 3) or out.shape[1] <= 3


def test_pop_overrides_and_context_failure_keeps_delivery(tiny):
    model, tokenizer = tiny
    receiver = HFReceiver(model, tokenizer, context_limit=40)
    receiver(_delivery(model, positions=5))
    with pytest.raises(ValueError, match="context space"):
        receiver.pop(max_new_tokens=100)
    assert len(receiver) == 1
    inputs = receiver.pop(prompt="Owner?", max_new_tokens=2)
    assert inputs["max_new_tokens"] == 2
    assert inputs["inputs_embeds"].shape[1] == 5 + _ids(tokenizer, "Owner?").shape[1]
    assert len(receiver) == 0


def test_selection_html_index_errors(tiny):
    model, tokenizer = tiny
    receiver = HFReceiver(model, tokenizer)
    receiver(_delivery(model))
    with pytest.raises(ValueError, match="request_index"):
        receiver.selection_html(request_index=3)
    with pytest.raises(ValueError, match="record_selection=True"):
        receiver.selection_html()
