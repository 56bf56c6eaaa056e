"""Text-aligned spans (sentence, line, paragraph) and max_span: the partitions, the keep step over
them, and the built-ins using them."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rclc import HFReceiver, transfer_sync
from rclc.selectors import cacheback, cacheback_scores, chunkkv, chunkkv_scores, is_builtin, keep_spans, qsnap
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors import _attention_capture as _capture, qsnap_scores
# private on purpose: selector internals under test (spans, keep step, pooling, support, prefetch)
from rclc.selectors._sentences import (
    partition,
    sender_sentence_spans,
    sentence_spans,
    split_long,
    text_spans,
    token_pieces,
)
from rclc.state import SenderState
from tests.helpers.selector_inputs import make_sender, request

DOCUMENT = (
    "The weather was mild. The Cedar project is owned by Alice and costs 3.5 million. "
    "Who owns Birch? Bob does!\nThe Maple project is based in Lima. "
    "Most staff work in Oslo. The annual report listed no unusual expenses."
)
SENTENCES = [
    "The weather was mild.",
    " The Cedar project is owned by Alice and costs 3.5 million.",
    " Who owns Birch?",
    " Bob does!",
    "\n",
    "The Maple project is based in Lima.",
    " Most staff work in Oslo.",
    " The annual report listed no unusual expenses.",
]

def decoded_spans(tokenizer, spans, ids):
    return [tokenizer.decode(ids[start:stop]) for start, stop in spans]


# -- the partition -------------------------------------------------------------------------


def test_pieces_concatenate_to_the_decoded_text(tiny_tokenizer):
    ids = tiny_tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"]
    assert "".join(token_pieces(tiny_tokenizer, ids)) == tiny_tokenizer.decode(ids)


def test_sentences_of_a_document(tiny_tokenizer):
    ids = tiny_tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"]
    spans = sentence_spans(token_pieces(tiny_tokenizer, ids), 16)
    assert decoded_spans(tiny_tokenizer, spans, ids) == SENTENCES


def test_sentence_ends_on_pieces():
    pieces = ["He", " said", ' "', "hi", ".", '"', " Then", " 3", ".", "5", " left", "?", "!", " End"]
    # The closing quote joins its sentence; a decimal point is no sentence end; "?!" ends once.
    assert sentence_spans(pieces, 4) == [(0, 6), (6, 13), (13, 14)]


def test_continuous_runs_use_the_fixed_grid():
    pieces = ["A", ".", " B", None, None, None, None, None, " C", ".", None, None]
    assert sentence_spans(pieces, 2) == [(0, 2), (2, 3), (3, 5), (5, 7), (7, 8), (8, 10), (10, 12)]


def test_text_without_sentence_ends_is_one_span():
    assert sentence_spans(["no", " end", " here"], 1) == [(0, 3)]


PIECES = st.lists(
    st.one_of(st.none(), st.sampled_from(["a", " b", ".", " .", "?", "!\n", "\n", '"', " 3", ".5", ". ", ")"])),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(PIECES, st.integers(1, 8))
def test_sentence_spans_partition_every_position(pieces, span_size):
    spans = sentence_spans(pieces, span_size)
    assert spans[0][0] == 0 and spans[-1][1] == len(pieces)
    assert all(stop > start for start, stop in spans)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    for start, stop in spans:
        kinds = {pieces[position] is None for position in range(start, stop)}
        assert len(kinds) == 1  # text and continuous rows never share a span
        if kinds == {True}:
            assert stop - start <= span_size


# -- the keep step over arbitrary partitions (sentences are one such) ------------------------


@st.composite
def partitioned_keep_cases(draw):
    total = draw(st.integers(1, 100))
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    bounds = [0, *cuts, total]
    spans = list(zip(bounds, bounds[1:]))
    latent = draw(st.integers(0, total - 1))
    budget = draw(st.integers(latent + 1, total + 3))
    values = draw(st.lists(st.floats(0, 10, width=32), min_size=total, max_size=total))
    return torch.tensor(values, dtype=torch.float32), budget, spans, latent


@settings(max_examples=300, deadline=None)
@given(partitioned_keep_cases())
def test_keep_step_properties_on_any_partition(case):
    scores, budget, spans, latent = case
    total = scores.shape[0]
    kept = keep_spans(scores, budget, spans, latent)
    assert kept == sorted(set(kept)) and len(kept) == min(budget, total)
    protected = {0, *range(total - latent, total)}
    assert protected <= set(kept)
    partial = 0
    for start, stop in spans:
        added = [p for p in range(start, stop) if p in kept and p not in protected]
        free = [p for p in range(start, stop) if p not in protected]
        if added and len(added) < len(free):
            partial += 1
            assert set(range(added[0], added[-1] + 1)) <= set(kept)
    assert partial <= 1


def test_whole_sentences_in_score_order():
    # Sentence means: [0,3) pinned 1.0, [3,10) 0.5, [10,12) 0.9. Budget 6: [0,3) and [10,12)
    # whole, then one position of [3,10) around its peak (position 6).
    scores = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.6, 0.5, 0.5, 0.4, 0.9, 0.9])
    assert keep_spans(scores, 6, [(0, 3), (3, 10), (10, 12)]) == [0, 1, 2, 6, 10, 11]


# -- the built-ins with span="sentence" ------------------------------------------------------

SCORES = {cacheback: cacheback_scores, qsnap: qsnap_scores}


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_selection_is_the_keep_step_over_sentences(tiny, selector):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT, latent_steps=2)
    ids = request(tokenizer)
    spans = sender_sentence_spans(sender, 16)
    assert spans[-1] == (sender.positions - 2, sender.positions)  # the latent tail is its own run
    scores = SCORES[selector](sender, ids)
    for budget in (3, 9, 17, sender.positions - 1):
        kept = selector(sender, ids, budget, span="sentence")
        assert kept == keep_spans(scores, budget, spans, 2)
        assert len(kept) == budget and {0, sender.positions - 2, sender.positions - 1} <= set(kept)


def test_chunkkv_averages_and_keeps_sentences(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    scores = chunkkv_scores(sender, window_size=8, span="sentence")
    spans = partition(sender, "sentence", 16)
    for start, stop in spans:
        assert torch.all(scores[start:stop] == scores[start])
    for budget in (4, 15):
        kept = chunkkv(sender, request(tokenizer), budget, window_size=8, span="sentence")
        assert kept == keep_spans(scores, budget, spans, 0)


def test_fixed_is_the_default(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    ids = request(tokenizer)
    assert cacheback(sender, ids, 10, span="fixed", span_size=4) == cacheback(sender, ids, 10, span_size=4)


def test_sentence_spans_through_transfer(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    selector = functools.partial(cacheback, span="sentence")
    assert is_builtin(selector)
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(sender, receiver, "Who owns Cedar?", ratio=4, selector=selector, record_selection=True)
    selection = receiver.peek(0)[0].messages[0].selection
    expected = cacheback(sender, sender.request_ids("Who owns Cedar?"), selection.budget, span="sentence")
    assert list(selection.indices) == expected


@pytest.mark.parametrize("span", ["sentences", "", None, 16])
@pytest.mark.parametrize("selector", [cacheback, qsnap, chunkkv])
def test_unknown_span_kind_is_refused(tiny, selector, span):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    with pytest.raises(ValueError, match="span: expected one of"):
        selector(sender, request(tokenizer), 4, span=span)


@pytest.mark.parametrize("missing", ["tokenizer", "token_ids"])
@pytest.mark.parametrize("selector", [cacheback, qsnap, chunkkv])
def test_sentences_need_the_senders_text(tiny, selector, missing, monkeypatch):
    model, tokenizer = tiny
    full = make_sender(model, tokenizer, DOCUMENT)
    fields = {
        "model": model,
        "past_key_values": full.past_key_values,
        "input_embeds": full.input_embeds,
        "tokenizer": full.tokenizer,
        "token_ids": full.token_ids,
    }
    fields[missing] = None
    sender = SenderState(**fields)
    calls = []
    monkeypatch.setattr(_capture, "forward_rows", lambda *a, **k: calls.append(1))
    # Refused before any model work, whether or not the budget needs a selection.
    for budget in (4, sender.positions):
        with pytest.raises(ValueError, match=f"span: 'sentence' needs the sender's text.*no {missing}"):
            selector(sender, request(tokenizer), budget, span="sentence")
    assert calls == []
    monkeypatch.undo()
    # The fixed grid still works on such a sender.
    assert len(selector(sender, request(tokenizer), 4)) == 4


# -- lines, paragraphs and the longest span ----------------------------------------------------


def test_lines_and_paragraphs_of_pieces():
    pieces = ["A", ".", " B", "\n", "C", " d", "\n", "\n", "E", ".", " F"]
    assert text_spans(pieces, 4, "line") == [(0, 4), (4, 7), (7, 8), (8, 11)]
    assert text_spans(pieces, 4, "paragraph") == [(0, 8), (8, 11)]
    assert text_spans(pieces, 4, "sentence") == [(0, 2), (2, 4), (4, 7), (7, 8), (8, 10), (10, 11)]
    # special tokens (chat markers) stand alone in paragraphs
    assert text_spans(["<s>", "sys", "\n", "hi", "</s>", "\n", "<s>", "u"], 4, "paragraph", breaks=[0, 4, 6]) == [
        (0, 1), (1, 4), (4, 5), (5, 6), (6, 7), (7, 8)]


@settings(max_examples=300, deadline=None)
@given(PIECES, st.integers(1, 8), st.sampled_from(["sentence", "line", "paragraph"]), st.integers(1, 9))
def test_text_spans_and_their_splits_partition_every_position(pieces, span_size, kind, longest):
    for spans in (text_spans(pieces, span_size, kind), split_long(text_spans(pieces, span_size, kind), longest)):
        assert spans[0][0] == 0 and spans[-1][1] == len(pieces)
        assert all(a[1] == b[0] and b[1] > b[0] for a, b in zip(spans, spans[1:]))
    split = split_long(text_spans(pieces, span_size, kind), longest)
    assert all(stop - start <= longest for start, stop in split)


def test_long_spans_split_into_near_equal_pieces():
    assert split_long([(0, 10), (10, 12)], 4) == [(0, 3), (3, 6), (6, 10), (10, 12)]
    assert split_long([(0, 10)], None) == [(0, 10)]


@pytest.mark.parametrize("kind", ["paragraph", "line"])
def test_the_builtins_keep_paragraphs_and_lines(tiny, kind):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT.replace(" Bob does!", " Bob does!\n"))
    ids = request(tokenizer)
    spans = partition(sender, kind, 16, 6)
    assert all(stop - start <= 6 for start, stop in spans)
    kept = cacheback(sender, ids, 9, span=kind, max_span=6)
    assert kept == keep_spans(cacheback_scores(sender, ids), 9, spans, 0)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_a_bad_max_span_is_refused(tiny, bad):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    with pytest.raises(ValueError, match="max_span: expected None or an int >= 1"):
        cacheback(sender, request(tokenizer), 4, span="sentence", max_span=bad)


# -- span_starts: runs of rows the caller knows begin somewhere ----------------------------------

RUNS = ["owned", " by", " Alice", " and", " The", " Birch", " project", " is", " old", ".", " Then", " more", "."]


def test_span_starts_cut_a_fragment_from_the_sentence_after_it():
    # A kept partial window ("owned by Alice and") joined to the next run: as text it would
    # merge with " The Birch project is old." into one "sentence" belonging to neither.
    assert text_spans(RUNS, 16) == [(0, 10), (10, 13)]
    assert text_spans(RUNS, 16, starts=[4]) == [(0, 4), (4, 10), (10, 13)]
    assert text_spans(RUNS, 16, starts=[0, 4, 10]) == [(0, 4), (4, 10), (10, 13)]  # 0 and a sentence start: no-ops


@settings(max_examples=60, deadline=None)
@given(pieces=PIECES, span_size=st.integers(1, 5), data=st.data())
def test_span_starts_keep_a_partition_cut_at_every_start(pieces, span_size, data):
    starts = data.draw(st.lists(st.integers(0, len(pieces) - 1), max_size=6))
    spans = text_spans(pieces, span_size, "sentence", starts=starts)
    assert spans[0][0] == 0 and spans[-1][1] == len(pieces)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    beginnings = {start for start, _ in spans}
    assert set(starts) <= beginnings
    # every text cut stays (a continuous run's grid restarts at a run start, so its cuts may move)
    assert {start for start, _ in text_spans(pieces, span_size, "sentence") if pieces[start] is not None} <= beginnings
    for start, stop in spans:
        if pieces[start] is None:
            assert stop - start <= span_size


@pytest.mark.parametrize("selector", [cacheback, qsnap])
def test_selectors_keep_over_spans_cut_at_span_starts(tiny, selector):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    ids = request(tokenizer)
    plain = sender_sentence_spans(sender, 16)
    middle = next((start + stop) // 2 for start, stop in plain if stop - start > 3)  # inside a sentence
    spans = partition(sender, "sentence", 16, None, [middle])
    assert (middle not in {start for start, _ in plain}) and middle in {start for start, _ in spans}
    scores = SCORES[selector](sender, ids)
    for budget in (3, 9, 17):
        kept = selector(sender, ids, budget, span="sentence", span_starts=[middle])
        assert kept == keep_spans(scores, budget, spans, 0)
    # the fixed grid is the seed's partition: it ignores span_starts
    assert partition(sender, "fixed", 4, None, [middle]) == partition(sender, "fixed", 4)
    assert selector(sender, ids, 9, span_size=4, span_starts=[middle]) == selector(sender, ids, 9, span_size=4)


def test_chunkkv_chunks_follow_span_starts(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    plain = partition(sender, "sentence", 16)
    middle = next((start + stop) // 2 for start, stop in plain if stop - start > 3)
    spans = partition(sender, "sentence", 16, None, [middle])
    chunkkv_module = importlib.import_module("rclc.selectors.chunkkv")  # the module, not the function
    prefix = chunkkv_module._check_options(sender, 16, 8, 5)
    scores = chunkkv_module._scores(sender, prefix, spans, 5)  # chunk means over the cut spans
    for start, stop in spans:
        assert torch.all(scores[start:stop] == scores[start])
    kept = chunkkv(sender, request(tokenizer), 6, window_size=8, span="sentence", span_starts=[middle])
    assert kept == keep_spans(scores, 6, spans, 0)


def test_span_starts_through_transfer(tiny):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    middle = next((start + stop) // 2 for start, stop in partition(sender, "sentence", 16) if stop - start > 3)
    selector = functools.partial(cacheback, span="sentence")
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    transfer_sync(sender, receiver, "Who owns Cedar?", budget=9, selector=selector, record_selection=True,
                  span_starts=[[middle]])
    selection = receiver.peek(0)[0].messages[0].selection
    ids = sender.request_ids("Who owns Cedar?")
    assert list(selection.indices) == cacheback(sender, ids, 9, span="sentence", span_starts=[middle])


@pytest.mark.parametrize(
    ("span_starts", "message"),
    [
        ([[1], [2]], "2 entries for 1 senders"),
        ("abc", "one entry per sender"),
        ([[10_000]], r"span_starts\[0\]: expected positions in \[0, "),
        ([[1.5]], r"span_starts\[0\]: expected positions"),
        ([5], r"span_starts\[0\]: expected a sequence of positions"),
    ],
)
def test_bad_span_starts_are_refused_before_any_selection(tiny, span_starts, message):
    model, tokenizer = tiny
    sender = make_sender(model, tokenizer, DOCUMENT)
    receiver = HFReceiver(model, tokenizer, max_new_tokens=2)
    with pytest.raises(ValueError, match=message):
        transfer_sync(sender, receiver, "Who owns Cedar?", budget=9, span_starts=span_starts)
    with pytest.raises(ValueError, match="request_index"):
        receiver.peek(0)  # nothing was delivered
