"""Sentence-aligned span partitions (`span="sentence"`): the sender's text cut at sentence ends.

On short documents the fixed 16-wide grid straddles sentences: a kept span carries the
tail of one fact and the head of the next, and the fact the request needs is cut in two.
Cutting spans where the sender's own text ends a sentence lets the keep step keep whole
sentences ranked by score (and a partial window only for the last one it reaches).

Boundaries come from the sender's token IDs, decoded piece by piece (so generated,
non-canonical tokenizations work too): a sentence ends after `.`, `!` or `?` (plus any
closing quotes or brackets) followed by whitespace or the end of the text, and after a
line break. Continuous rows (ID -1: latent steps, received embeddings) have no text, so
each run of them is cut on the fixed `span_size` grid instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import RclcError
from ..state import SenderState
from ._spans import Span, fixed_spans

SPAN_KINDS = ("fixed", "sentence")

_SENTENCE_END = re.compile(r"[.!?]+[\"'\u2019\u201d)\]]*(?=\s|$)|\n")


def check_span(span: Any) -> str:
    if not isinstance(span, str) or span not in SPAN_KINDS:
        raise RclcError(f"span: expected one of {SPAN_KINDS}, got {span!r}")
    return span


def check_span_option(sender: SenderState, span: Any) -> str:
    """Validate `span` and, for sentences, that the sender carries its text (before any model work)."""
    check_span(span)
    if span == "sentence":
        check_sentence_sender(sender)
    return span


def check_sentence_sender(sender: SenderState) -> None:
    """`span="sentence"` reads the sender's text: it needs the tokenizer and the token IDs."""
    missing = [name for name in ("tokenizer", "token_ids") if getattr(sender, name) is None]
    if missing:
        raise RclcError(
            f"span: 'sentence' needs the sender's text, but the sender has no {' and no '.join(missing)}; "
            "build it with rclc.sender_from_hf (which records both) or use span='fixed'"
        )


def sentence_spans(pieces: Sequence[str | None], span_size: int) -> list[Span]:
    """A partition of `len(pieces)` positions into sentences.

    `pieces[i]` is the text of position `i` (None for a continuous row); a span stops after
    the piece holding a sentence end. Runs of continuous rows are split on the
    `span_size` grid of the run.
    """
    total = len(pieces)
    stops: set[int] = set()
    text_parts: list[str] = []
    owner: list[int] = []  # position holding each character of the concatenated text
    for position, piece in enumerate(pieces):
        if piece is None:
            continue
        text_parts.append(piece)
        owner.extend([position] * len(piece))
    text = "".join(text_parts)
    for match in _SENTENCE_END.finditer(text):
        stops.add(owner[match.end() - 1] + 1)
    spans: list[Span] = []
    start = 0
    for position in range(total):
        stop = position + 1
        continuous = pieces[position] is None
        next_differs = stop < total and (pieces[stop] is None) != continuous
        if stop == total or next_differs or (not continuous and stop in stops):
            if continuous:
                spans.extend((start + a, start + b) for a, b in fixed_spans(stop - start, span_size))
            else:
                spans.append((start, stop))
            start = stop
    return spans


def token_pieces(tokenizer: Any, token_ids: Sequence[int]) -> list[str | None]:
    """The text each ID contributes to the decoded sequence (None for -1).

    Each ID is decoded after a fixed anchor token and the anchor's text removed: decoders
    that drop a word's leading space at the start of a text (SentencePiece) then keep it,
    so the pieces concatenate to the decoded text.
    """
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][:1]
    options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    anchor_text = tokenizer.decode(anchor, **options) if anchor else ""
    real = [int(token) for token in token_ids if token >= 0]
    decoded = tokenizer.batch_decode([[*anchor, token] for token in real], **options) if real else []
    found = iter(decoded)
    pieces: list[str | None] = []
    for token in token_ids:
        if token < 0:
            pieces.append(None)
            continue
        text = next(found)
        anchored = text.startswith(anchor_text)
        pieces.append(text[len(anchor_text) :] if anchored else tokenizer.decode([token], **options))
    return pieces


def sender_sentence_spans(sender: SenderState, span_size: int) -> list[Span]:
    """The sentence partition of a sender's positions (its tokenizer decodes its IDs)."""
    check_sentence_sender(sender)
    return sentence_spans(token_pieces(sender.tokenizer, sender.token_ids.tolist()), span_size)


def partition(sender: SenderState, span: str, span_size: int) -> list[Span]:
    """The spans the keep step fills the budget with, for a validated `span` option."""
    if span == "sentence":
        return sender_sentence_spans(sender, span_size)
    return fixed_spans(sender.positions, span_size)
