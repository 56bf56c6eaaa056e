"""Bridging (`bridge=N`): the best spans of a first scoring put in front of the request, then scored again."""

from __future__ import annotations

import functools

import pytest
import torch

from rclc import Exclusion, HFReceiver, RclcError, transfer_sync
from rclc.policy import selector_option_problems
from rclc.selection import Selection
from rclc.selectors import cacheback, chunkkv, qsnap
# private on purpose: selector internals under test (bridge choice, profiles, pooling)
from rclc.selectors._bridge import NEUTRAL_REQUEST, bridge_tokens, bridged, lifted, mixed
# private on purpose: selector internals under test (bridge choice, profiles, pooling)
from rclc.selectors._common import SpanOptions, SpanProfile
# private on purpose: selector internals under test (bridge choice, profiles, pooling)
from rclc.selectors._pooling import profile_of
# private on purpose: selector internals under test (bridge choice, profiles, pooling)
from rclc.selectors.transfer_steps import bridge_flags
from rclc.testing import tiny_model
from tests.helpers.selector_inputs import make_sender

FIRST = "The Lynx agency belongs to Jonas Moreno. The Lynx agency was founded in 1969. Nadia Varga leads Marble."
SECOND = "Emeka Eriksen was born in 1941. Jonas Moreno was born in 1964. Nadia Varga was born in 1971."
QUESTION = "In which year was the owner of the Lynx agency born?"


def _profile(sender, scores, spans, excluded=None):
    return SpanProfile(torch.tensor(scores, dtype=torch.float32), spans, excluded, sender.latent_steps)


def _distinct(tokens, spans):
    """`tokens` less those found in more than two of `spans` (an independent count)."""
    return [token for token in tokens if sum(token in span for span in spans) <= 2]


def test_the_best_span_bridges_in_source_order_and_what_the_request_says_does_not(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, FIRST)
    ids = sender.token_ids.tolist()
    total = len(ids)
    third = total // 3
    spans = [(0, third), (third, 2 * third), (2 * third, total)]
    texts = [ids[1:third], ids[third:2 * third], ids[2 * third:]]  # position 0 is protected
    scores = [0.0] * total
    for position in range(third, 2 * third):
        scores[position] = 5.0  # the middle span scores best
    for position in range(2 * third, total):
        scores[position] = 2.0
    request = torch.tensor([[1, 2, 3]])
    profile = _profile(sender, scores, spans)
    assert bridge_tokens([sender], [profile], [request], 1) == _distinct(texts[1], texts)
    # two spans: both, in source order (not in score order)
    assert bridge_tokens([sender], [profile], [request], 2) == _distinct(texts[1], texts) + _distinct(texts[2], texts)
    # a span the request already says (half or more of its tokens in runs of 4 it holds) never
    # bridges, and the others' tokens are counted without it; one that shares only single
    # tokens with the request does
    said = torch.tensor([[5] + ids[third:2 * third] + [6]])
    assert bridge_tokens([sender], [profile], [said], 1) == _distinct(texts[2], [texts[0], texts[2]])
    scattered = torch.tensor([ids[third:2 * third:2]])
    assert bridge_tokens([sender], [profile], [scattered], 1) == _distinct(texts[1], texts)
    # nor an excluded one, nor the first position (an attention sink) on its own
    excluded = [False] * third + [True] * third + [False] * (total - 2 * third)
    assert bridge_tokens([sender], [_profile(sender, scores, spans, excluded)], [request], 1) == _distinct(
        texts[2], [texts[0], texts[2]])
    sink = [9.0] + [0.0] * (total - 1)
    assert bridge_tokens([sender], [_profile(sender, sink, [(0, 1), (1, total)])], [request], 1) == ids[1:]
    assert bridged(request, []) is request
    assert bridged(request, [7, 8]).tolist() == [[7, 8, 1, 2, 3]]


def test_only_the_bridges_distinctive_tokens_extend_the_request(tiny):
    # a token found in three or more candidate spans (a relation word, "the") is left out;
    # one in at most two (the name the bridge introduces) stays
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, FIRST)
    total = sender.positions
    ids = sender.token_ids.tolist()
    size = (total - 1) // 4
    spans = [(0, 1)] + [(1 + k * size, 1 + (k + 1) * size) for k in range(3)] + [(1 + 3 * size, total)]
    scores = [0.0] * total
    for position in range(*spans[1]):
        scores[position] = 5.0
    tokens = bridge_tokens([sender], [_profile(sender, scores, spans)], [torch.tensor([[1]])], 1)
    texts = [ids[start:stop] for start, stop in spans[1:]]
    assert tokens == _distinct(texts[0], texts)
    common = [token for token in texts[0] if sum(token in text for text in texts) > 2]
    assert common and not set(common) & set(tokens)


def test_the_bridge_is_chosen_above_what_a_neutral_request_attends_to(tiny):
    # the rows right before any request draw its attention; the bridge is chosen on the first
    # scoring less a neutral request's, so a span that only sits there does not win
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, FIRST)
    total = sender.positions
    spans = [(0, 1), (1, total // 2), (total // 2, total)]
    asked = [0.0] + [3.0] * (total // 2 - 1) + [4.0] * (total - total // 2)
    anyway = [0.0] + [0.5] * (total // 2 - 1) + [3.5] * (total - total // 2)
    first, neutral = _profile(sender, asked, spans), _profile(sender, anyway, spans)
    request = torch.tensor([[1]])
    assert bridge_tokens([sender], [first], [request], 1) == sender.token_ids[total // 2:].tolist()
    assert bridge_tokens([sender], [lifted(first, neutral)], [request], 1) == sender.token_ids[1:total // 2].tolist()


def test_a_latent_row_never_bridges(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, FIRST, latent_steps=4)
    total = sender.positions
    scores = [0.0] * (total - 4) + [9.0] * 4  # the latent tail scores best, but has no tokens
    profile = SpanProfile(torch.tensor(scores), [(0, total - 4), (total - 4, total)], None, 0)
    tokens = bridge_tokens([sender], [profile], [torch.tensor([[1]])], 1)
    assert tokens == sender.token_ids[1:total - 4].tolist()


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_a_bridged_selection_ranks_by_the_mean_of_both_scorings(tiny, selector):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, FIRST + " " + SECOND)
    request = sender.request_ids(QUESTION)
    options = functools.partial(selector, span="sentence")
    first = profile_of(options, sender, request, None)
    neutral = profile_of(options, sender, sender.request_ids(NEUTRAL_REQUEST), None)
    tokens = bridge_tokens([sender], [lifted(first, neutral)], [request], 1)  # chosen above a neutral request
    assert tokens  # the first scoring found a span the question does not say
    second = profile_of(options, sender, bridged(request, tokens), None)
    both = mixed(first, second)
    assert torch.equal(both.scores, (first.scores.float() + second.scores.float()) / 2) and both.spans == first.spans
    budget = sender.positions // 3
    assert selector(sender, request, budget, span="sentence", bridge=1) == both.keep(budget)
    assert selector(sender, request, budget, span="sentence", bridge=0) == first.keep(budget)


@pytest.mark.parametrize("allocation", ["pooled", "per_sender"])
def test_a_transfer_bridges_its_senders_once(tiny, allocation):
    # The bridge is the best span of all senders together, every sender is scored again with
    # it (not each with its own best span), and each keeps by the mean of its two scorings.
    model, tokenizer = tiny
    senders = [make_sender(model, tokenizer, FIRST), make_sender(model, tokenizer, SECOND)]
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    selector = functools.partial(cacheback, span="sentence", bridge=1)
    transfer_sync(senders, receiver, QUESTION, ratio=3, allocation=allocation, selector=selector,
                  record_selection=True)
    kept = [message.selection for message in receiver.peek(0)[0].messages]
    requests = [sender.request_ids(QUESTION) for sender in senders]
    first = [profile_of(selector, sender, request, None, bridge=0) for sender, request in zip(senders, requests)]
    neutral = [profile_of(selector, sender, sender.request_ids(NEUTRAL_REQUEST), None, bridge=0) for sender in senders]
    tokens = bridge_tokens(senders, [lifted(one, zero) for one, zero in zip(first, neutral)], requests, 1)
    assert tokens and kept[0].bridge == tokenizer.decode(tokens)
    for sender, request, one, selection in zip(senders, requests, first, kept):
        both = mixed(one, profile_of(selector, sender, bridged(request, tokens), None, bridge=0))
        assert list(selection.indices) == both.keep(selection.budget)
    if allocation == "per_sender":
        plain = HFReceiver(model, tokenizer, max_new_tokens=2)
        transfer_sync(senders, plain, QUESTION, ratio=3, selector=functools.partial(cacheback, span="sentence"),
                      record_selection=True)
        assert [s.budget for s in kept] == [m.selection.budget for m in plain.peek(0)[0].messages]


def test_bridge_is_checked_and_only_request_scoring_selectors_take_it(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, FIRST)
    request = sender.request_ids(QUESTION)
    for wrong in (-1, 1.5, True, "1"):
        with pytest.raises(RclcError, match="bridge: expected an int >= 0"):
            cacheback(sender, request, 8, bridge=wrong)
    with pytest.raises(TypeError):
        chunkkv(sender, request, 8, bridge=1)
    with pytest.raises(RclcError, match="bridge: ChunkKV scores no request"):
        profile_of(functools.partial(chunkkv, chunk_size=4), sender, request, None, bridge=1)
    assert selector_option_problems("cacheback", {"bridge": 2}) == []
    assert "a whole number >= 0" in selector_option_problems("qsnap", {"bridge": -1})[0][1]
    assert "has no option 'bridge'" in selector_option_problems("chunkkv", {"bridge": 1})[0][1]
    assert SpanOptions.from_keywords({"bridge": 2})[0].bridge == 2


def test_senders_of_two_models_cannot_share_a_bridge(tiny):
    model, tokenizer = tiny
    other, _ = tiny_model("llama", seed=3, tokenizer=tokenizer)
    senders = [make_sender(model, tokenizer, FIRST), make_sender(other, tokenizer, SECOND)]
    delivered = []  # a plain callable receiver: an HFReceiver would refuse the second model itself
    before = [sender.positions for sender in senders]
    with pytest.raises(RclcError, match="bridge: the senders of one transfer use different models"):
        transfer_sync(senders, delivered.append, QUESTION, ratio=3, allocation="pooled",
                      selector=functools.partial(cacheback, span="sentence", bridge=1))
    assert [sender.positions for sender in senders] == before and delivered == []


def test_rows_an_exclusion_could_pass_over_never_bridge_whatever_it_excludes(tiny):
    # the edge passes over chat markup only, yet the bridge skips instructions and known text
    model, tokenizer = tiny
    senders = [make_sender(model, tokenizer, FIRST), make_sender(model, tokenizer, SECOND)]
    roles = [["instruction"] * 6 + ["material"] * (sender.positions - 6) for sender in senders]
    flags = bridge_flags(senders, QUESTION, [], Exclusion(reasons=("template",), roles=tuple(roles)))
    assert [flag[:6] for flag in flags] == [[True] * 6] * 2
    assert not any(flags[1][6:])  # nothing of the second sender is known or markup
    assert bridge_flags(senders, QUESTION, [], None) == [None, None]


def test_the_record_says_what_bridged(tiny):
    model, tokenizer = tiny
    senders = [make_sender(model, tokenizer, FIRST), make_sender(model, tokenizer, SECOND)]
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(senders, receiver, QUESTION, ratio=3, selector=functools.partial(cacheback, span="sentence", bridge=1),
                  record_selection=True)
    records = [message.selection for message in receiver.peek(0)[0].messages]
    assert records[0].bridge and records[0].bridge == records[1].bridge  # per sender budgets, one bridge
    assert Selection.from_dict(records[0].to_dict()) == records[0] and records[0].inspect()["bridge"]
    plain = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(senders, plain, QUESTION, ratio=3, record_selection=True)
    record = plain.peek(0)[0].messages[0].selection
    assert record.bridge is None and "bridge" not in record.to_dict()
