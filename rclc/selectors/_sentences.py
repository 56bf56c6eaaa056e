"""Text-aligned span partitions: the sender's text cut at sentence, line or paragraph ends.

On short documents the fixed 16-wide grid straddles sentences: a kept span carries the
tail of one fact and the head of the next, and the fact the request needs is cut in two.
Cutting spans where the sender's own text ends a sentence (`span="sentence"`), a line
(`"line"`) or a paragraph (`"paragraph"`) lets the keep step keep whole units ranked by
score (and a partial window only for the last one it reaches). `max_span` splits any span
longer than that many positions into near-equal pieces, so one long sentence or paragraph
cannot take a small budget in one piece.

Boundaries come from the sender's token IDs, decoded piece by piece (so generated,
non-canonical tokenizations work too):
- sentence: after `.`, `!` or `?` (plus any closing quotes or brackets) followed by
  whitespace or the end of the text, and after a line break;
- line: after every line break;
- paragraph: after a blank line, and around every special token (chat-template markers
  such as `<|im_start|>` start and end messages, which are paragraphs of their own kind).
Continuous rows (ID -1: latent steps, received embeddings) have no text, so each run of
them is cut on the fixed `span_size` grid instead.

`span_starts` (positions where the caller knows a new run of rows begins) are cut too. A
chain's inherited rows are the runs an earlier hop kept, joined: a kept partial window ends
mid-sentence, and decoded as one text it would merge with the next run into a "sentence"
that belongs to neither, so a later hop could keep half of a fact and the head of another.
Cutting where the rows' origins stop being consecutive keeps each inherited run apart. The
fixed grid ignores them: it is the seed's position-aligned partition and stays as defined.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from .._arguments import is_exact_int
from ..errors import RclcError
from ..policy import SPAN_KINDS
from ..state import SenderState
from ._spans import Span, fixed_spans

TEXT_SPAN_KINDS = SPAN_KINDS[1:]

_ENDS = {
    "sentence": re.compile(r"[.!?]+[\"'\u2019\u201d)\]]*(?=\s|$)|\n"),
    "line": re.compile(r"\n"),
    "paragraph": re.compile(r"\n[ \t\r\f\v]*\n"),
}


def check_span(span: Any) -> str:
    if not isinstance(span, str) or span not in SPAN_KINDS:
        raise RclcError(f"span: expected one of {SPAN_KINDS}, got {span!r}")
    return span


def check_max_span(max_span: Any) -> int | None:
    """None (no limit) or an int >= 1."""
    if max_span is not None and (not is_exact_int(max_span) or max_span < 1):
        raise RclcError(f"max_span: expected None or an int >= 1 (the longest span the keep step takes), got {max_span!r}")
    return max_span


def check_span_option(sender: SenderState, span: Any) -> str:
    """Validate `span` and, for text-aligned kinds, that the sender carries its text (before any model work)."""
    check_span(span)
    if span in TEXT_SPAN_KINDS:
        check_text_sender(sender, span)
    return span


def check_text_sender(sender: SenderState, span: str = "sentence") -> None:
    """Text-aligned spans read the sender's text: they need the tokenizer and the token IDs."""
    missing = [name for name in ("tokenizer", "token_ids") if getattr(sender, name) is None]
    if missing:
        raise RclcError(
            f"span: {span!r} needs the sender's text, but the sender has no {' and no '.join(missing)}; "
            "build it with rclc.sender_from_hf (which records both) or use span='fixed'"
        )


def text_spans(
    pieces: Sequence[str | None],
    span_size: int,
    kind: str = "sentence",
    *,
    breaks: Collection[int] = (),
    starts: Collection[int] = (),
) -> list[Span]:
    """A partition of `len(pieces)` positions into text units of `kind`.

    `pieces[i]` is the text of position `i` (None for a continuous row); a span stops after
    the piece holding a unit's end. Positions in `breaks` (special tokens, for paragraphs)
    stand alone; a span also starts at every position in `starts`. Runs of continuous rows
    are split on the `span_size` grid of the run.
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
    for match in _ENDS[kind].finditer(text):
        stops.add(owner[match.end() - 1] + 1)
    for position in breaks:
        stops.update((position, position + 1))
    stops.update(starts)
    runs = set(starts)  # continuous rows have no text ends, but a run start cuts them too
    spans: list[Span] = []
    start = 0
    for position in range(total):
        stop = position + 1
        continuous = pieces[position] is None
        next_differs = stop < total and (pieces[stop] is None) != continuous
        if stop == total or next_differs or stop in (runs if continuous else stops):
            if continuous:
                spans.extend((start + a, start + b) for a, b in fixed_spans(stop - start, span_size))
            else:
                spans.append((start, stop))
            start = stop
    return spans


def sentence_spans(pieces: Sequence[str | None], span_size: int) -> list[Span]:
    """`text_spans` of sentences (see the module docstring)."""
    return text_spans(pieces, span_size, "sentence")


def split_long(spans: Sequence[Span], max_span: int | None) -> list[Span]:
    """Every span longer than `max_span` cut into the fewest near-equal pieces of at most `max_span`.

    Near-equal rather than `max_span` plus a remainder, so no stub of one or two positions
    is left to be ranked on its own.
    """
    if max_span is None:
        return list(spans)
    result: list[Span] = []
    for start, stop in spans:
        length = stop - start
        pieces = -(-length // max_span)
        bounds = [start + (length * i) // pieces for i in range(pieces + 1)]
        result.extend(zip(bounds, bounds[1:]))
    return result


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


def special_positions(tokenizer: Any, token_ids: Sequence[int]) -> list[int]:
    """Positions holding the tokenizer's special tokens (chat-template markers, end of text)."""
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    return [position for position, token in enumerate(token_ids) if token in special]


def sender_text_spans(
    sender: SenderState, span_size: int, kind: str, span_starts: Collection[int] = ()
) -> list[Span]:
    """The `kind` partition of a sender's positions (its tokenizer decodes its IDs), also cut at `span_starts`."""
    check_text_sender(sender, kind)
    ids = sender.token_ids.tolist()
    breaks = special_positions(sender.tokenizer, ids) if kind == "paragraph" else ()
    return text_spans(token_pieces(sender.tokenizer, ids), span_size, kind, breaks=breaks, starts=span_starts)


def sender_sentence_spans(sender: SenderState, span_size: int) -> list[Span]:
    """The sentence partition of a sender's positions (its tokenizer decodes its IDs)."""
    return sender_text_spans(sender, span_size, "sentence")


def check_span_starts(span_starts: Any, total: int) -> tuple[int, ...]:
    """The `span_starts` option: None or positions in [0, total) where a run of rows begins."""
    if span_starts is None:
        return ()
    if isinstance(span_starts, (str, bytes)) or not isinstance(span_starts, Collection):
        raise RclcError(
            f"span_starts: expected a sequence of positions where a run of rows begins, got {type(span_starts).__name__}"
        )
    for position in span_starts:
        if not is_exact_int(position) or not 0 <= position < total:
            raise RclcError(f"span_starts: expected positions in [0, {total}) for a sender of {total} positions, got {position!r}")
    return tuple(span_starts)


def partition(
    sender: SenderState, span: str, span_size: int, max_span: int | None = None, span_starts: Collection[int] = ()
) -> list[Span]:
    """The spans the keep step fills the budget with, for validated `span`, `max_span` and
    `span_starts` options (the fixed grid ignores `span_starts`: module docstring)."""
    if span == "fixed":
        spans = fixed_spans(sender.positions, span_size)
    else:
        spans = sender_text_spans(sender, span_size, span, span_starts)
    return split_long(spans, max_span)
