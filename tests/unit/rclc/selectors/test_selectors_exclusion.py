"""Receiver-aware selection: matching what the receiver holds, the keep step's exclusion tier,
every built-in selector and baseline with `exclude`, and `transfer(..., exclude=...)`."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rclc import Exclusion, HFReceiver, transfer_sync
from rclc.selectors.transfer_steps import accepts_exclude
from rclc.exclusion import known_grams, known_positions, position_reasons
from rclc.selectors import (
    cacheback,
    cacheback_scores,
    chunkkv,
    keep_spans,
    qsnap,
    qsnap_scores,
    random_selector,
    recent,
)
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._common import SpanOptions, whole_span_flags
from rclc.selectors._receiver_aware import duplicate_flags
from rclc.selectors._sentences import partition, token_pieces
from rclc.selectors._spans import refine
from tests.helpers.selector_inputs import make_sender, request

DOCUMENT = (
    "Question: Who owns the Cedar project?\nThe Cedar project is owned by Alice. "
    "The Birch project is owned by Bob. Find the owner and launch date."
)


def grams(*texts, size=4):
    return known_grams(texts, size)


# -- matching text the receiver holds --------------------------------------------------------


def test_a_copy_of_the_question_is_known_however_it_was_tokenized():
    question = "Who owns the Cedar project?"
    for pieces in (
        ["Question", ":", " Who", " owns", " the", " Cedar", " project", "?", "\n", "The", " Cedar", " project", " is"],
        ["Quest", "ion:", " Wh", "o own", "s the C", "edar pro", "ject?", "\n", "The", " Cedar", " project", " is"],
    ):
        known = known_positions(pieces, grams(question), 4)
        text = "".join(piece for piece, flag in zip(pieces, known) if flag)
        assert text.replace(" ", "").lower().startswith("whowns") or "owns" in text.lower()
        assert not any(known[-4:])  # "The Cedar project is" shares 3 words only: not known
        assert not known[0]  # "Question" is not in the question


def test_normalisation_ignores_case_and_punctuation():
    pieces = ["who", " OWNS", " the", " cedar", " PROJECT", "!!"]
    assert all(known_positions(pieces, grams("Who owns the Cedar project?"), 4))


def test_short_overlaps_and_continuous_rows_break_runs():
    assert known_positions(["The", " Cedar", " project"], grams("Who owns the Cedar project?"), 4) == [False] * 3
    pieces = ["Who", " owns", None, " the", " Cedar", " project"]
    assert known_positions(pieces, grams("Who owns the Cedar project?"), 4) == [False] * 6
    assert known_positions(["a", " b"], set(), 4) == [False, False]


def test_markers_are_stripped_from_known_texts():
    assert known_grams(["<|im_start|>user\nWho owns it now"], 4, strip=["<|im_start|>"]) == {("user", "who", "owns", "it"),
                                                                                           ("who", "owns", "it", "now")}


def test_reasons_follow_the_documented_order():
    roles = ["template", "instruction", "material", "material", "instruction"]
    known = [True, True, True, False, False]
    assert position_reasons(6, ("template", "instruction", "known"), roles=roles, special=[5], known=known + [False]) == [
        "template", "instruction", "known", None, "instruction", "template"]
    assert position_reasons(3, ("known",), roles=["instruction"] * 3, known=[False, True, False]) == [None, "known", None]
    assert position_reasons(2, (), roles=["template", "template"], special=[0]) == [None, None]


@pytest.mark.parametrize("bad", [("nope",), ("known", "known"), "known"])
def test_exclusion_refuses_bad_reasons(bad):
    with pytest.raises(ValueError, match="exclude.reasons"):
        Exclusion(reasons=bad)


def test_exclusion_refuses_bad_roles_and_counts():
    with pytest.raises(ValueError, match=r"exclude.roles\[0\]: 'prose'"):
        Exclusion(roles=(["prose"],))
    with pytest.raises(ValueError, match="min_words"):
        Exclusion(min_words=0)
    with pytest.raises(ValueError, match="exclude.known"):
        Exclusion(known=("a", 3))
    exclusion = Exclusion(roles=(["material"] * 3, None))
    with pytest.raises(ValueError, match="2 entries for 1 senders"):
        exclusion.check_senders([3])
    with pytest.raises(ValueError, match=r"roles\[0\]: 3 labels for a sender of 4"):
        exclusion.check_senders([4, 9])


# -- the keep step's exclusion tier ----------------------------------------------------------


def test_excluded_spans_rank_after_all_others_and_their_budget_moves_on():
    # Spans [0,4) [4,8) [8,12): the best one ([4,8), the "question copy") is excluded. The
    # pinned first position lifts span [0,4) to mean 2.3, above [8,12) at 1.25.
    scores = torch.tensor([0.1, 0.1, 0.1, 0.1, 9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 2.0, 1.0])
    spans = [(0, 4), (4, 8), (8, 12)]
    assert keep_spans(scores, 5, spans) == [0, 4, 5, 6, 7]
    excluded = [False] * 4 + [True] * 4 + [False] * 4
    assert keep_spans(scores, 5, spans, excluded=excluded) == [0, 1, 2, 3, 10]
    assert keep_spans(scores, 8, spans, excluded=excluded) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert keep_spans(scores, 10, spans, excluded=excluded) == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11]  # then the rest


def test_protected_positions_stay_kept_when_excluded():
    scores = torch.tensor([0.0, 1.0, 1.0, 3.0, 3.0])
    # the partial window hugs the pinned first position (its peak), as without exclusion
    assert keep_spans(scores, 3, [(0, 5)], latent_steps=1, excluded=[True] * 5) == [0, 1, 4]


def test_refine_cuts_spans_where_the_flag_changes():
    assert refine([(0, 5), (5, 7)], [False, True, True, False, False, True, False]) == [
        (0, 1), (1, 3), (3, 5), (5, 6), (6, 7)]
    assert refine([(0, 3)], None) == [(0, 3)]


@st.composite
def excluded_cases(draw):
    total = draw(st.integers(1, 60))
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    bounds = [0, *cuts, total]
    latent = draw(st.integers(0, total - 1))
    budget = draw(st.integers(latent + 1, total + 2))
    values = draw(st.lists(st.floats(0, 10, width=32), min_size=total, max_size=total))
    excluded = draw(st.lists(st.booleans(), min_size=total, max_size=total))
    return torch.tensor(values), budget, list(zip(bounds, bounds[1:])), latent, excluded


@settings(max_examples=300, deadline=None)
@given(excluded_cases())
def test_excluded_positions_only_fill_what_is_left(case):
    scores, budget, spans, latent, excluded = case
    total = scores.shape[0]
    kept = set(keep_spans(scores, budget, spans, latent, excluded))
    assert len(kept) == min(budget, total)
    protected = {0, *range(total - latent, total)}
    assert protected <= kept
    free = {p for p in range(total) if not excluded[p] and p not in protected}
    if any(excluded[p] and p not in protected for p in kept):
        assert free <= kept  # an excluded row is kept only once every other row is


# -- the built-ins and baselines with `exclude` ------------------------------------------------

SCORES = {cacheback: cacheback_scores, qsnap: qsnap_scores}


def _mask(sender, tokenizer, text_excluded: str):
    pieces = token_pieces(tokenizer, sender.token_ids.tolist())
    mask, cursor = [], 0
    start = "".join(pieces).find(text_excluded)
    for piece in pieces:
        inside = start <= cursor < start + len(text_excluded)
        mask.append("known" if inside else None)
        cursor += len(piece)
    return mask


@pytest.mark.parametrize("selector", [cacheback, qsnap])
@pytest.mark.parametrize("span", ["fixed", "sentence"])
@pytest.mark.parametrize("exclude_by", ["position", "span"])
def test_attention_selectors_keep_over_the_refined_partition(tiny, selector, span, exclude_by):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    mask = _mask(sender, tokenizer, " Who owns the Cedar project?")
    flags = [reason is not None for reason in mask]
    ids = request(tokenizer)
    scores = SCORES[selector](sender, ids)
    if exclude_by == "span":  # spans passed over whole (whole_span_flags)
        flags = whole_span_flags(partition(sender, span, 4), mask) or [False] * len(mask)
    spans = refine(partition(sender, span, 4), flags)
    for budget in (3, 8, 15):
        kept = selector(sender, ids, budget, span=span, span_size=4, exclude=mask, exclude_by=exclude_by)
        assert kept == keep_spans(scores, budget, spans, 0, flags)
        assert not any(flags[p] for p in kept if p != 0) or budget > flags.count(False)
        if exclude_by == "position":  # the default: the seed's rule, unchanged
            assert kept == selector(sender, ids, budget, span=span, span_size=4, exclude=mask)


def test_text_spans_are_passed_over_whole_and_markup_alone():
    """A sentence mostly known is passed over whole; one partly known is kept whole (not cut
    into orphan fragments); chat markup is passed over position by position."""
    spans = [(0, 2), (2, 8), (8, 14)]
    reasons = ["template", None, None, "known", "known", "known", "known", None,  # 4 of 6 known: passed over
               None, "known", "known", None, None, "template"]  # 2 of 5: kept whole, markup still out
    flags = whole_span_flags(spans, reasons)
    assert flags == [True, False] + [True] * 6 + [False] * 5 + [True]
    assert whole_span_flags([(0, 3)], [None, "known", None]) is None


def test_exclude_by_span_is_opt_in_and_changes_only_partly_excluded_spans(tiny):
    """Off by default: a sentence with a known run is cut around it; with exclude_by="span" the
    same sentence is kept or passed over whole."""
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    mask = _mask(sender, tokenizer, " The Cedar project is owned")  # part of one sentence, not all of it
    options = SpanOptions(span="sentence", exclude=mask)
    default_spans, default_flags = options.spans(sender)
    whole_spans, whole_flags = replace(options, exclude_by="span").spans(sender)
    assert default_flags == [reason is not None for reason in mask]  # position by position, as before
    assert len(whole_spans) < len(default_spans)  # the sentence is no longer cut around the known run
    for start, stop in whole_spans:
        assert len({whole_flags[p] for p in range(start, stop) if mask[p] != "template"} if whole_flags else {False}) == 1
    with pytest.raises(ValueError, match="exclude_by: expected one of 'position', 'span'"):
        cacheback(sender, request(tokenizer), 4, span="sentence", exclude=mask, exclude_by="sentence")


def test_chunkkv_and_baselines_pass_over_excluded_positions(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    total = sender.positions
    mask = [None] * total
    for position in range(total - 6, total):
        mask[position] = "instruction"
    ids = request(tokenizer)
    assert recent(sender, ids, 4, exclude=mask) == list(range(total - 10, total - 6))
    assert recent(sender, ids, 4) == list(range(total - 4, total))
    assert recent(sender, ids, total - 2, exclude=mask)[-4:] == list(range(total - 4, total))  # then fills up
    chosen = random_selector(3)(sender, ids, 8, exclude=mask)
    assert chosen[0] == 0 and len(chosen) == 8 and all(p < total - 6 for p in chosen)
    assert random_selector(3)(sender, ids, 8) == random_selector(3)(sender, ids, 8, exclude=[None] * total)
    kept = chunkkv(sender, ids, 10, window_size=8, chunk_size=4, exclude=mask)
    assert len(kept) == 10 and all(p < total - 6 for p in kept)  # the window ranks first, except excluded rows


@pytest.mark.parametrize("bad", ["known", [None], [None, ""], [None, 3]])
def test_a_bad_mask_is_refused_before_any_model_work(tiny, bad):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, "Who owns Cedar?")
    mask = bad if not isinstance(bad, list) or len(bad) != 2 else bad + [None] * (sender.positions - 2)
    with pytest.raises(ValueError, match="exclude"):
        cacheback(sender, request(tokenizer), 2, exclude=mask)


def test_which_selectors_take_exclude():
    def custom(sender, request_ids, budget):
        return [0]

    def aware(sender, request_ids, budget, *, exclude=None):
        return [0]

    assert accepts_exclude(cacheback) and accepts_exclude(recent) and accepts_exclude(random_selector(1))
    assert accepts_exclude(functools.partial(qsnap, span="sentence")) and accepts_exclude(aware)
    assert not accepts_exclude(custom)
    assert not accepts_exclude(functools.partial(cacheback, exclude=[None]))  # bound already


# -- through transfer ------------------------------------------------------------------------


def _transfer(model, tokenizer, sender, **options):
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(sender, receiver, "Who owns the Cedar project?", record_selection=True, **options)
    return receiver.peek(0)[0].messages[0].selection


def test_transfer_passes_over_the_request_copy_and_records_why(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    selection = _transfer(model, tokenizer, sender, budget=12, exclude=Exclusion(reasons=("known",)))
    excluded = [span for span in selection.spans if span.excluded]
    assert [span.excluded for span in excluded] == ["known"]
    assert "Who owns the Cedar project?" in excluded[0].text
    assert selection.excluded == {"known": excluded[0].stop - excluded[0].start}
    assert not any(position in selection.indices for position in range(excluded[0].start, excluded[0].stop))
    mask = [("known" if excluded[0].start <= p < excluded[0].stop else None) for p in range(sender.positions)]
    ids = sender.request_ids("Who owns the Cedar project?")
    assert list(selection.indices) == cacheback(sender, ids, 12, exclude=mask)
    report = selection.inspect()
    assert report["excluded"] == selection.excluded and report["allocation"] == "per_sender"
    assert any(span["excluded"] == "known" for span in report["spans"])


def test_roles_mark_instructions_and_special_tokens_mark_template(tiny):
    model, tokenizer = tiny
    text = "<|im_start|>system\nFind the owner.<|im_end|>\nThe Cedar project is owned by Alice."
    sender = make_sender(model, tokenizer, text)
    pieces = token_pieces(tokenizer, sender.token_ids.tolist())
    roles, cursor = [], 0
    for piece in pieces:
        roles.append("instruction" if 19 <= cursor < 34 else "material")
        cursor += len(piece)
    selection = _transfer(model, tokenizer, sender, budget=6, exclude=Exclusion(roles=(roles,)))
    reasons = {span.excluded for span in selection.spans}
    assert {"template", "instruction"} <= reasons
    kept_text = "".join(span.text for span in selection.spans if span.kept and span.text)
    assert "Find the owner" not in kept_text


def test_transfer_refuses_what_cannot_exclude_before_any_model_work(tiny, monkeypatch):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)

    def custom(state, request_ids, budget):
        return [0]

    calls = []
    monkeypatch.setattr("rclc.selectors._attention_capture.forward_rows", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match="takes no exclude= keyword"):
        _transfer(model, tokenizer, sender, budget=4, selector=custom, exclude=Exclusion())
    with pytest.raises(ValueError, match=r"exclude.roles\[0\]: 2 labels"):
        _transfer(model, tokenizer, sender, budget=4, exclude=Exclusion(roles=(["material"] * 2,)))
    with pytest.raises(ValueError, match="expected rclc.Exclusion"):
        _transfer(model, tokenizer, sender, budget=4, exclude=("known",))
    assert calls == []
    # An empty set of reasons excludes nothing, so any selector may run.
    assert list(_transfer(model, tokenizer, sender, budget=4, selector=custom, exclude=Exclusion(reasons=())).indices) == [0]


# issue 24 item 11: several requests with exclude= raised IndexError (the fitted budgets' name
# was reused for the receivers' prompts)
def test_several_requests_and_receivers_with_exclusion_each_get_their_delivery(tiny):
    model, tokenizer = tiny
    requests = ["Who owns the Cedar project?", "When did Lima open its harbour?"]
    sender = make_sender(model, tokenizer, f"Questions: {requests[0]}\n{requests[1]}\n" + DOCUMENT.split("\n", 1)[1])
    receivers = [HFReceiver(model, tokenizer, max_new_tokens=2) for _ in range(2)]
    transfer_sync(sender, receivers, requests, budget=12, exclude=Exclusion(reasons=("known",)), record_selection=True)
    for receiver in receivers:
        deliveries = [receiver.peek(index)[0] for index in range(len(requests))]
        assert [delivery.request for delivery in deliveries] == requests
        for delivery, text in zip(deliveries, requests):
            selection = delivery.messages[0].selection
            assert len(selection.indices) == 12
            excluded = "".join(span.text for span in selection.spans if span.excluded == "known")
            assert text in excluded  # each request's own copy passed over, not the other's
            assert not any(other in excluded for other in requests if other != text)


# -- duplicate: a fan-in's shared prompt is sent once ------------------------------------------

SHARED = "Read part of a text and keep what helps answer the question.\nQuestion: Who owns the Cedar project?\n"


def test_duplicate_flags_mark_runs_an_earlier_sender_holds_and_leave_the_first_copy():
    first = [" Keep", " what", " helps", " answer", " the", " question", ".", None, " Cedar", " is", " old"]
    second = [" keep", " WHAT", " helps", " answer", " the", " question", "!", None, " The", " Cedar", " is", " new"]
    third = [" keep", " what", " helps", " answer", " the", " ask"]
    flags = duplicate_flags([first, second, third], 6)
    assert flags[0] is None  # the first sender's copy ranks as usual
    assert flags[1] == [True] * 7 + [False] * 5  # case and punctuation do not matter; "Cedar is" is 2 words
    assert flags[2] == [False] * 6  # five shared words are not a six-word run
    assert duplicate_flags([first, None, second], 6)[1] is None  # a sender without text is never marked
    assert not any(duplicate_flags([first, second], 7)[1] or [])  # the run length is an option


def test_duplicate_is_opt_in_and_checked():
    assert "duplicate" not in Exclusion().reasons
    assert Exclusion(reasons=("duplicate",)).duplicate_words == 6
    with pytest.raises(ValueError, match="exclude.duplicate_words"):
        Exclusion(reasons=("duplicate",), duplicate_words=0)


def test_a_fan_in_sends_its_shared_prompt_once(tiny):
    model, tokenizer = tiny
    documents = ["The Cedar project is owned by Alice. It opened in 1990.",
                 "The Birch project is owned by Bob. It closed in 2001.",
                 "Lima has a harbour. The harbour opened in 1870."]
    senders = [make_sender(model, tokenizer, SHARED + document) for document in documents]
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(senders, receiver, "Who owns the Cedar project?", budget=8, record_selection=True,
                  exclude=Exclusion(reasons=("duplicate",)))
    selections = [message.selection for message in receiver.peek(0)[0].messages]
    marked = ["".join(span.text for span in selection.spans if span.excluded == "duplicate") for selection in selections]
    assert marked[0] == ""  # the first reader's copy is its own
    for text in marked[1:]:
        assert "keep what helps answer the question" in text and "Who owns the Cedar project?" in text
        assert "Alice" not in text and "Bob" not in text and "harbour" not in text  # documents share no six-word run
    for selection in selections[1:]:
        kept = "".join(span.text for span in selection.spans if span.kept and span.text)
        assert "Who owns the Cedar" not in kept  # its budget went to its own document
