"""CacheBack on the embedded SmolLM2-135M: capture is invisible, and the request steers selection."""

from __future__ import annotations

import pytest
import torch

# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers, forward_rows, prefill, view_cache
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors import _attention_capture as _capture, cacheback, cacheback_scores
from rclc.state import SenderState

pytestmark = pytest.mark.integration

SENTENCES = [
    "The Cedar project is owned by Alice and was launched in Oslo in 2021.",
    "The Birch project is owned by Bob and was launched in Lima in 2019.",
    "The Maple project is owned by Chen and was launched in Hanoi in 2017.",
    "The Aspen project is owned by Dana and was launched in Quito in 2015.",
    "The Rowan project is owned by Emeka and was launched in Accra in 2013.",
    "The Willow project is owned by Farah and was launched in Porto in 2011.",
    "The Hazel project is owned by Goran and was launched in Perth in 2009.",
    "The Larch project is owned by Hana and was launched in Tallinn in 2007.",
]


def sender_for(model, tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        rows = model.get_input_embeddings().weight[ids].clone()
    return SenderState(model, prefill(model, rows), rows, tokenizer=tokenizer, token_ids=ids)


def sentence_bounds(tokenizer):
    bounds, start = [], 0
    for index in range(len(SENTENCES)):
        stop = len(tokenizer(" ".join(SENTENCES[: index + 1]), add_special_tokens=False)["input_ids"])
        bounds.append((start, stop))
        start = stop
    return bounds


def test_capture_leaves_logits_and_sender_unchanged(embedded, monkeypatch):
    model, tokenizer = embedded
    sender = sender_for(model, tokenizer, " ".join(SENTENCES))
    ids = tokenizer(" Who owns Maple?", add_special_tokens=False, return_tensors="pt")["input_ids"]
    cached = [(k.clone(), v.clone()) for k, v in cache_layers(sender.past_key_values)]
    plain, _ = forward_rows(model, view_cache(model, sender.past_key_values), input_ids=ids)
    hidden = []
    original = _capture.forward_rows

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        hidden.append(out[0])
        return out

    monkeypatch.setattr(_capture, "forward_rows", recording)
    cacheback_scores(sender, ids)
    with torch.no_grad():
        captured_logits, plain_logits = model.lm_head(hidden[0]), model.lm_head(plain)
    # The capture computes each global layer's attention output from its own softmax (issue
    # 28), so its logits agree with the plain forward's to float32 rounding, not bit for bit:
    # measured at most 3.1e-5 on logits up to 29 in magnitude; a changed forward is far off.
    torch.testing.assert_close(captured_logits, plain_logits, rtol=1e-5, atol=1e-3)
    assert torch.equal(captured_logits.argmax(-1), plain_logits.argmax(-1))
    for (k, v), (k0, v0) in zip(cache_layers(sender.past_key_values), cached):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("target", range(len(SENTENCES)))
def test_question_about_one_entity_ranks_its_sentence_high(embedded, target):
    model, tokenizer = embedded
    sender = sender_for(model, tokenizer, " ".join(SENTENCES))
    name = SENTENCES[target].split()[1]
    ids = tokenizer(
        f" Question: who owns the {name} project, and where was it launched?",
        add_special_tokens=False,
        return_tensors="pt",
    )["input_ids"]
    scores = cacheback_scores(sender, ids)
    bounds = sentence_bounds(tokenizer)
    means = [float(scores[start:stop].mean()) for start, stop in bounds]
    ranking = sorted(range(len(SENTENCES)), key=lambda index: -means[index])
    # The first sentence also holds the attention sink, so "high" means in the top two of eight.
    assert ranking.index(target) <= 1, (name, ranking)
    kept = set(cacheback(sender, ids, sender.positions // 4))
    start, stop = bounds[target]
    assert len(kept & set(range(start, stop))) / (stop - start) > 0.25


def test_a_fan_in_scored_in_one_forward_keeps_what_each_sender_keeps_alone(embedded):
    """Three readers of unequal length, one question: the batched capture's folds match the
    ones captured alone, and CacheBack r4 keeps the same positions from either."""
    # private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
    from rclc.selectors._support import offering, request_fold, request_folds

    model, tokenizer = embedded
    senders = [sender_for(model, tokenizer, " ".join(SENTENCES[start:stop])) for start, stop in ((0, 2), (2, 5), (5, 8))]
    question = tokenizer("Who owns the Maple project?", add_special_tokens=False, return_tensors="pt")["input_ids"]
    together = request_folds(senders, [question] * len(senders))
    for sender, fold in zip(senders, together):
        alone = request_fold(sender, question, moments=True)
        torch.testing.assert_close(fold.votes, alone.votes, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fold.row_energy, alone.row_energy, rtol=1e-4, atol=1e-5)
        budget = -(-sender.positions // 4)
        with offering([(sender, question, fold)]):
            kept = cacheback(sender, question, budget)
        assert kept == cacheback(sender, question, budget)
