"""Binding forms, roles, lazy history prefill, output reservation and context limits of bound agents."""

from __future__ import annotations

import copy

import pytest
import torch

import rclc
from rclc import sender_from_hf, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers, cache_length, prefill
from rclc.hf_senders import render_messages
from rclc.testing import tiny_model
from tests.helpers.agents import (
    prompts_alone,
    DOC,
    HISTORY_A,
    HISTORY_B,
    QUESTION,
    assert_unchanged,
    counted_forwards,
    generate_ids,
    history,
    ids_of,
    same_cache,
    view,
)


def _fresh_prefill(model, ids):
    return prefill(model, model.get_input_embeddings().weight[ids[0]])


def test_bind_is_the_agent_constructor(tiny):
    model, tokenizer = tiny
    assert rclc.bind is rclc.Agent
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    assert isinstance(agent, rclc.Agent) and isinstance(agent, rclc.HFReceiver)
    assert agent.engine is None and agent.model is model and agent.backend == "hf"


# ---------------------------------------------------------------------------------------
# Binding forms


def test_messages_binding_is_lazy_and_renders_without_generation_prompt(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    report = agent.inspect()
    assert report["state_source"] == "messages" and report["cached_positions"] == 0
    with counted_forwards(model) as calls:
        state = agent.sender_state()
    expected = render_messages(tokenizer, HISTORY_A, generation_prompt=False)
    assert calls == [expected.shape[1]]
    assert torch.equal(state.token_ids, expected[0])
    assert state.inherited_positions == 0 and state.latent_steps == 0
    assert same_cache(state.past_key_values, _fresh_prefill(model, expected))
    assert agent.inspect()["cached_positions"] == expected.shape[1]


@pytest.mark.parametrize("form", ["text", "ids", "messages"])
def test_explicit_prompt_binding(tiny, form):
    model, tokenizer = tiny
    ids = ids_of(tokenizer, DOC)
    prompt = {"text": DOC, "ids": ids, "messages": [{"role": "user", "content": DOC}]}[form]
    agent = rclc.bind(model, tokenizer, prompt=prompt)
    report = agent.inspect()
    assert report["state_source"] == "retained"
    state = agent.sender_state()
    if form == "messages":
        assert torch.equal(state.token_ids, render_messages(tokenizer, prompt, generation_prompt=False)[0])
    else:
        assert torch.equal(state.token_ids, ids[0])
    assert report["cached_positions"] == state.positions


def test_explicit_cache_binding_reuses_or_extends_a_copy(tiny):
    model, tokenizer = tiny
    ids = ids_of(tokenizer, DOC)
    complete = _fresh_prefill(model, ids)
    agent = rclc.bind(model, tokenizer, prompt=ids, past_key_values=complete)
    assert agent.sender_state().past_key_values is complete

    prefix = _fresh_prefill(model, ids[:, :9])
    before = [(k.clone(), v.clone()) for k, v in cache_layers(prefix)]
    with counted_forwards(model) as calls:
        extended = rclc.bind(model, tokenizer, prompt=ids, past_key_values=prefix)
    assert calls == [ids.shape[1] - 9], "only the missing suffix is prefilled"
    assert cache_length(prefix) == 9
    assert all(torch.equal(k, kb) and torch.equal(v, vb) for (k, v), (kb, vb) in zip(cache_layers(prefix), before))
    assert same_cache(extended.sender_state().past_key_values, complete)


def test_generation_binding(tiny):
    model, tokenizer = tiny
    output = generate_ids(model, tokenizer, ids_of(tokenizer, DOC))
    agent = rclc.bind(model, tokenizer, generation=output)
    state = agent.sender_state()
    assert torch.equal(state.token_ids, output.sequences[0])
    assert same_cache(state.past_key_values, _fresh_prefill(model, output.sequences))


def test_messages_stay_receiver_history_with_explicit_state(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_B), prompt=DOC)
    assert agent.inspect()["state_source"] == "retained"
    sender = sender_from_hf(model, tokenizer, DOC)
    transfer_sync(sender, agent, QUESTION)
    expected = render_messages(
        tokenizer, [*HISTORY_B, {"role": "user", "content": QUESTION}], generation_prompt=True
    )
    assert torch.equal(agent.peek(0)[1].input_ids, expected)
    # The explicit state, not the history, is what the agent sends.
    assert torch.equal(agent.sender_state().token_ids, ids_of(tokenizer, DOC)[0])


def test_unbound_state_refuses_to_send_but_receives(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer)
    before = view(agent)
    with pytest.raises(ValueError, match="no state"):
        agent.sender_state()
    got = []
    with pytest.raises(ValueError, match="no state"):
        transfer_sync(agent, got.append, QUESTION)
    assert got == []
    assert_unchanged(agent, before)
    transfer_sync(sender_from_hf(model, tokenizer, DOC), agent, QUESTION)
    assert len(agent) == 1
    entry = agent.inspect()["deliveries"][0]
    inputs = agent.pop()
    assert inputs["inputs_embeds"].shape[1] == sum(entry["retained_positions"]) + entry["prompt_positions"]
    assert inputs["max_new_tokens"] == 128


def test_agent_without_tokenizer_needs_ids(tiny):
    model, tokenizer = tiny
    ids = ids_of(tokenizer, DOC)
    agent = rclc.bind(model, None, prompt=ids)
    assert agent.sender_state().positions == ids.shape[1]
    before = view(agent)
    with pytest.raises(ValueError, match="tokenizer"):
        agent.update("rendered text")
    assert_unchanged(agent, before)
    with pytest.raises(ValueError, match="tokenizer"):
        rclc.bind(model, None, prompt="rendered text")
    silent = rclc.bind(model, None, messages=history(HISTORY_A))
    with pytest.raises(ValueError, match="tokenizer"):
        silent.sender_state()


# ---------------------------------------------------------------------------------------
# Roles


def test_role_is_decided_by_position(tiny):
    model, tokenizer = tiny
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B))
    transfer_sync(a, b, QUESTION)
    assert (len(a), len(b)) == (0, 1)
    b.pop()
    b.update(prompt=DOC)
    transfer_sync(b, a, "Anything else?")
    assert (len(a), len(b)) == (1, 0)
    # Lists mix agents and plain sender states; an agent may be both sender and receiver.
    plain = sender_from_hf(model, tokenizer, DOC)
    transfer_sync([a, plain, b], [a, b], QUESTION)
    assert (len(a), len(b)) == (2, 1)
    assert len(a.peek(1)[0].messages) == 3


# ---------------------------------------------------------------------------------------
# Lazy history prefill


def test_history_prefill_reuses_the_cached_prefix(tiny):
    model, tokenizer = tiny
    messages = history(HISTORY_A)
    agent = rclc.bind(model, tokenizer, messages=messages)
    first = agent.sender_state()
    with counted_forwards(model) as calls:
        again = agent.sender_state()
    assert calls == [] and again is first, "an unchanged history is not prefilled again"

    messages.append({"role": "user", "content": "Add: Birch is owned by Bob."})
    full = render_messages(tokenizer, messages, generation_prompt=False)
    with counted_forwards(model) as calls:
        longer = agent.sender_state()
    assert calls == [full.shape[1] - first.positions], "only the appended suffix is prefilled"
    assert torch.equal(longer.token_ids, full[0])
    assert same_cache(longer.past_key_values, _fresh_prefill(model, full))
    assert cache_length(first.past_key_values) == first.positions, "the previous cache is untouched"

    messages[0] = {"role": "system", "content": "You are agent A, edited."}
    edited = render_messages(tokenizer, messages, generation_prompt=False)
    with prompts_alone(model), counted_forwards(model) as calls:  # the model's prefix store reuses nothing
        fresh = agent.sender_state()
    assert calls == [edited.shape[1]], "an earlier edit forces a fresh prefill"
    assert same_cache(fresh.past_key_values, _fresh_prefill(model, edited))


def test_transfer_uses_the_lazy_history_state(tiny):
    model, tokenizer = tiny
    messages = history(HISTORY_A)
    agent = rclc.bind(model, tokenizer, messages=messages)
    got = []
    transfer_sync(agent, got.append, QUESTION, ratio=1)
    state = agent.sender_state()
    assert agent.inspect()["cached_positions"] == state.positions == got[0].messages[0].positions
    transfer_sync(agent, got.append, QUESTION, ratio=1)
    assert agent.sender_state() is state
    messages.append({"role": "user", "content": "More."})
    transfer_sync(agent, got.append, QUESTION, ratio=1)
    assert got[2].messages[0].positions == render_messages(tokenizer, messages, generation_prompt=False).shape[1]


# ---------------------------------------------------------------------------------------
# Output reservation and context limits


def test_max_new_tokens_default_and_context_limit_fit_the_budget(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, " ".join([DOC] * 3))
    roomy = rclc.bind(model, tokenizer, messages=history(HISTORY_B))
    assert roomy.max_new_tokens == 128 and roomy.context_limit == model.config.max_position_embeddings
    prompt = roomy.prepare_request(QUESTION).input_ids.shape[1]
    tight = rclc.bind(model, tokenizer, messages=history(HISTORY_B), context_limit=prompt + 128 + 10)
    transfer_sync(sender, roomy, QUESTION, ratio=1)
    assert roomy.inspect()["deliveries"][0]["retained_positions"] == [sender.positions]
    assert roomy.inspect()["deliveries"][0]["reserved_output_positions"] == 128

    transfer_sync(sender, tight, QUESTION, ratio=1)
    entry = tight.inspect()["deliveries"][0]
    assert entry["retained_positions"] == [10] and entry["remaining_positions"] == 0
    # Two receivers of one request: the tightest sets the budget for both.
    transfer_sync(sender, [roomy, tight], QUESTION, ratio=1)
    assert roomy.inspect()["deliveries"][1]["retained_positions"] == [10]

    smaller_output = rclc.bind(
        model, tokenizer, messages=history(HISTORY_B), context_limit=prompt + 128 + 10, max_new_tokens=100
    )
    transfer_sync(sender, smaller_output, QUESTION, ratio=1)
    assert smaller_output.inspect()["deliveries"][0]["retained_positions"] == [38]
    assert smaller_output.pop()["max_new_tokens"] == 100


def test_receiver_without_room_gets_nothing(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, DOC)
    full = rclc.bind(model, tokenizer, messages=history(HISTORY_B))
    prompt = full.prepare_request(QUESTION).input_ids.shape[1]
    cramped = rclc.bind(model, tokenizer, messages=history(HISTORY_B), context_limit=prompt + 128)
    with pytest.raises(ValueError, match="handoff positions"):
        transfer_sync(sender, [full, cramped], QUESTION)
    assert len(full) == len(cramped) == 0


# ---------------------------------------------------------------------------------------
# Constructor and update errors (spec section 20, items 28, 29, 31)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"backend": "tpu"}, "backend"),
        ({"request_id": "r1"}, "vllm"),
        ({"allow_unstable": True}, "vllm"),
        ({"allow_unstable": "yes"}, "allow_unstable"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2.0}, "max_new_tokens"),
        ({"context_limit": 0}, "context_limit"),
        ({"context_limit": 10**6}, "context_limit"),
        ({"past_key_values": "cache"}, "prompt"),
    ],
)
def test_constructor_errors(tiny, options, match):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=match):
        rclc.bind(model, tokenizer, **options)


def test_training_mode_and_unsupported_models_are_refused(tiny_tokenizer):
    model, tokenizer = tiny_model("qwen3", tokenizer=tiny_tokenizer)
    model.train()
    with pytest.raises(ValueError, match="training"):
        rclc.bind(model, tokenizer)
    with pytest.raises(ValueError, match="model"):
        rclc.bind(object(), tokenizer)


def _state_errors(model, tokenizer):
    ids = ids_of(tokenizer, DOC)
    output = generate_ids(model, tokenizer, ids, max_new_tokens=2)
    with torch.no_grad():
        beams = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, num_beams=2, do_sample=False,
            return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
        )
    with torch.no_grad():
        from_rows = model.generate(
            inputs_embeds=model.get_input_embeddings().weight[ids[0]].unsqueeze(0), attention_mask=torch.ones_like(ids),
            max_new_tokens=2, do_sample=False, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
        )
    longer = _fresh_prefill(model, ids)
    return [
        ({"generation": from_rows}, "inputs_embeds"),
        ({"prompt": DOC, "generation": output}, "generation"),
        ({"past_key_values": longer, "generation": output}, "generation"),
        ({"generation": beams}, "beam"),
        ({"generation": ids}, "generation"),
        ({"prompt": []}, "messages"),
        ({"prompt": ids[:, :5], "past_key_values": longer}, "past_key_values"),
        ({"prompt": ids.to(torch.int32)}, "int64"),
        ({"prompt": ""}, "empty"),
    ]


def test_binding_state_errors(tiny):
    model, tokenizer = tiny
    for options, match in _state_errors(model, tokenizer):
        with pytest.raises(ValueError, match=match):
            rclc.bind(model, tokenizer, **options)


def test_update_state_errors_keep_the_previous_state(tiny):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A), prompt=DOC)
    for options, match in _state_errors(model, tokenizer):
        before = view(agent)
        prompt = options.pop("prompt", None)
        with pytest.raises(ValueError, match=match):
            agent.update(prompt, **options)
        assert_unchanged(agent, before)
    before = view(agent)
    with pytest.raises(ValueError, match="request_id"):
        agent.update(DOC, request_id="r1")
    assert_unchanged(agent, before)


def test_chat_without_template_and_prompt_above_the_context(tiny_tokenizer):
    model, tokenizer = tiny_model("llama", tokenizer=tiny_tokenizer, max_positions=24)
    with pytest.raises(ValueError, match="context limit"):
        rclc.bind(model, tokenizer, prompt=DOC)
    no_template = copy.deepcopy(tokenizer)
    no_template.chat_template = None
    agent = rclc.bind(model, no_template, messages=history(HISTORY_A))
    with pytest.raises(ValueError, match="chat template"):
        agent.sender_state()
    with pytest.raises(ValueError, match="chat template"):
        rclc.bind(model, no_template, prompt=[{"role": "user", "content": "hi"}])


def test_tensor_request_with_chat_history_is_refused(tiny):
    model, tokenizer = tiny
    sender = sender_from_hf(model, tokenizer, DOC)
    chatty = rclc.bind(model, tokenizer, messages=history(HISTORY_B))
    bare = rclc.bind(model, tokenizer)
    with pytest.raises(ValueError, match="token-ID request"):
        transfer_sync(sender, [bare, chatty], ids_of(tokenizer, QUESTION))
    assert len(bare) == len(chatty) == 0
    transfer_sync(sender, bare, ids_of(tokenizer, QUESTION))
    assert len(bare) == 1 and torch.equal(bare.peek(0)[1].input_ids, ids_of(tokenizer, QUESTION))
