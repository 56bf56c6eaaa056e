"""Receiver-aware selection: sender positions a handoff should not spend its budget on.

A sender's state holds more than what it read or wrote: chat-template markers, its own
instructions (system prompt, the fixed text of its prompt template) and, often, text the
receiver already holds (a reader's copy of the question its receiver is asked). Such rows
score high against the request (the question copy most of all) and take a small budget
while carrying nothing new to the receiver. `transfer(..., exclude=rclc.Exclusion())`
marks them, per sender and request, for these reasons (`rclc.policy.EXCLUSION_REASONS`; the
first three unless `reasons` names others):

- `template`: the tokenizer's special tokens, and positions the caller marks `template`;
- `instruction`: positions the caller marks `instruction` (`roles`, one label per position
  of each sender; the caller built the prompt, so it knows which text was its own template);
- `known`: positions whose text the receiver already holds: the request, the prompts of the
  planned receivers (`HFReceiver` and bound agents; the n-grams all of them share) and any
  `known` texts. Text is matched on normalised words (NFKC, case folded, punctuation
  ignored): a sender word is known when it lies in a run of `min_words` consecutive words
  that also occurs in a known text, so the match does not depend on where the tokenizer
  cut words, and a shared entity name or relation word alone never matches.
- `duplicate` (opt-in): positions whose text an earlier sender of the same transfer also
  holds, in a run of `duplicate_words` consecutive words (same matching). The readers of a
  fan-out each hold the same instructions and question; each copy scored high and took its
  reader's budget, though the receiver needs at most one. Only the first sender's copy
  ranks normally. The run is longer than `known`'s because different documents share short
  runs ("the Osprey workshop is") that may be the evidence; six-word runs shared by two
  documents are rare outside boilerplate (measured in docs/experiments.md).

Excluded positions are not dropped outright: the keep step ranks every span holding them
after all other spans, so the budget they would have taken goes to the next-best spans and
they are kept only when the budget exceeds everything else. The first position and the
latent tail stay kept. The selection record says which positions were excluded and why.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._arguments import is_exact_int
from .errors import RclcError
from .policy import DEFAULT_EXCLUSION_REASONS, EXCLUSION_REASONS, POSITION_ROLES

__all__ = ["Exclusion", "known_positions", "position_reasons"]

_WORD = re.compile(r"\w+")
DEFAULT_MIN_WORDS = 4
DEFAULT_DUPLICATE_WORDS = 6


@dataclass(frozen=True)
class Exclusion:
    """What a transfer's selection passes over (see the module docstring).

    `reasons`: a subset of `("template", "instruction", "known", "duplicate")` (default: the
    first three; empty: nothing is excluded). `known`: texts the receivers hold beyond the
    request and their planned prompts (e.g. the prompt a graph node will really generate
    from). `roles`: None, or one entry per sender (None for a sender without labels), each a
    sequence of `"material" | "instruction" | "template"` with one label per position of that
    sender's state. `min_words`: the shortest run of shared words that counts as known;
    `duplicate_words`: the shortest run an earlier sender must share for `duplicate`.
    """

    reasons: tuple[str, ...] = DEFAULT_EXCLUSION_REASONS
    known: tuple[str, ...] = ()
    roles: tuple[Sequence[str] | None, ...] | None = None
    min_words: int = DEFAULT_MIN_WORDS
    duplicate_words: int = DEFAULT_DUPLICATE_WORDS

    def __post_init__(self) -> None:
        reasons = tuple(self.reasons) if isinstance(self.reasons, (list, tuple)) else self.reasons
        if not isinstance(reasons, tuple) or any(reason not in EXCLUSION_REASONS for reason in reasons):
            raise RclcError(f"exclude.reasons: expected a tuple drawn from {EXCLUSION_REASONS}, got {self.reasons!r}")
        if len(set(reasons)) != len(reasons):
            raise RclcError(f"exclude.reasons: each reason once, got {reasons!r}")
        known = tuple(self.known) if isinstance(self.known, (list, tuple)) else self.known
        if not isinstance(known, tuple) or not all(isinstance(text, str) for text in known):
            raise RclcError(f"exclude.known: expected a tuple of texts, got {self.known!r}")
        if not is_exact_int(self.min_words) or self.min_words < 1:
            raise RclcError(f"exclude.min_words: expected an int >= 1, got {self.min_words!r}")
        if not is_exact_int(self.duplicate_words) or self.duplicate_words < 1:
            raise RclcError(f"exclude.duplicate_words: expected an int >= 1, got {self.duplicate_words!r}")
        roles = self.roles
        if roles is not None:
            if not isinstance(roles, (list, tuple)):
                raise RclcError("exclude.roles: expected one entry per sender (a sequence of role labels, or None)")
            roles = tuple(None if entry is None else tuple(entry) for entry in roles)
            for index, entry in enumerate(roles):
                if entry is not None and any(role not in POSITION_ROLES for role in entry):
                    bad = next(role for role in entry if role not in POSITION_ROLES)
                    raise RclcError(f"exclude.roles[{index}]: {bad!r} is not one of {POSITION_ROLES}")
        object.__setattr__(self, "reasons", reasons)
        object.__setattr__(self, "known", known)
        object.__setattr__(self, "roles", roles)

    def check_senders(self, totals: Sequence[int]) -> None:
        """Refuse `roles` that do not label every position of every sender (before any model work)."""
        if self.roles is None:
            return
        if len(self.roles) != len(totals):
            raise RclcError(
                f"exclude.roles: {len(self.roles)} entries for {len(totals)} senders; give one per sender (None: no labels)"
            )
        for index, (entry, total) in enumerate(zip(self.roles, totals)):
            if entry is not None and len(entry) != total:
                raise RclcError(
                    f"exclude.roles[{index}]: {len(entry)} labels for a sender of {total} positions; label every position"
                )


# -- matching text the receiver holds ---------------------------------------------------------


def _normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def _grams(words: Sequence[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + size]) for i in range(len(words) - size + 1)}


def known_grams(texts: Iterable[str], min_words: int, *, strip: Iterable[str] = ()) -> set[tuple[str, ...]]:
    """Every run of `min_words` consecutive normalised words of `texts` (`strip`: markers to drop first)."""
    markers = [marker for marker in strip if marker]
    grams: set[tuple[str, ...]] = set()
    for text in texts:
        for marker in markers:
            text = text.replace(marker, "\n")
        grams |= _grams(_WORD.findall(_normalise(text)), min_words)
    return grams


def known_positions(pieces: Sequence[str | None], grams: set[tuple[str, ...]], min_words: int) -> list[bool]:
    """Which positions hold text the receiver already has.

    `pieces[i]` is the text of position `i` (None: a continuous row or a special token,
    which breaks word runs and is never known). A word is known when it lies in a run of
    `min_words` consecutive words found in `grams`; a position is known when every
    non-space character it holds belongs to such a run (trailing punctuation included), or,
    for a whitespace-only piece, when it sits inside one.
    """
    total = len(pieces)
    if not grams or total == 0:
        return [False] * total
    chars: list[str] = []
    owner: list[int] = []
    segment_of: list[int] = []
    segment = 0
    bounds: list[tuple[int, int]] = []
    for position, piece in enumerate(pieces):
        start = len(chars)
        if piece is None:
            segment += 1
        else:
            text = _normalise(piece)
            chars.extend(text)
            owner.extend([position] * len(text))
            segment_of.extend([segment] * len(text))
        bounds.append((start, len(chars)))
    text = "".join(chars)
    words = [(match.start(), match.end()) for match in _WORD.finditer(text)]
    tokens = [text[a:b] for a, b in words]
    marked = [False] * len(words)
    for i in range(len(words) - min_words + 1):
        if segment_of[words[i][0]] != segment_of[words[i + min_words - 1][0]]:
            continue
        if tuple(tokens[i : i + min_words]) in grams:
            for j in range(i, i + min_words):
                marked[j] = True
    covered = bytearray(len(text))
    i = 0
    while i < len(words):
        if not marked[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(words) and marked[j + 1] and segment_of[words[j + 1][0]] == segment_of[words[i][0]]:
            j += 1
        end = words[j][1]
        while end < len(text) and not text[end].isspace() and not _WORD.match(text[end]):
            end += 1  # the run's closing punctuation ("?" after a question) goes with it
        covered[words[i][0] : end] = b"\x01" * (end - words[i][0])
        i = j + 1
    result = []
    for start, stop in bounds:
        if stop == start:
            result.append(False)
            continue
        solid = [c for c in range(start, stop) if not text[c].isspace()]
        result.append(all(covered[c] for c in (solid or range(start, stop))))
    return result


# -- one sender's reasons ---------------------------------------------------------------------


def position_reasons(
    total: int,
    reasons: Sequence[str],
    *,
    roles: Sequence[str] | None = None,
    special: Iterable[int] = (),
    known: Sequence[bool] | None = None,
    duplicate: Sequence[bool] | None = None,
) -> list[str | None]:
    """Per position, the first reason (in `EXCLUSION_REASONS` order) that excludes it, else None.

    `roles` labels the first `len(roles)` positions (rows appended after them, such as latent
    rows of reasoning, count as material); `special` are special-token positions; `known`
    flags positions whose text the receiver holds; `duplicate` those an earlier sender holds.
    """
    wanted = set(reasons)
    result: list[str | None] = [None] * total
    specials = set(special)
    for position in range(total):
        role = roles[position] if roles is not None and position < len(roles) else "material"
        if "template" in wanted and (role == "template" or position in specials):
            result[position] = "template"
        elif "instruction" in wanted and role == "instruction":
            result[position] = "instruction"
        elif "known" in wanted and known is not None and known[position]:
            result[position] = "known"
        elif "duplicate" in wanted and duplicate is not None and duplicate[position]:
            result[position] = "duplicate"
    return result


def strip_markers(tokenizer: Any) -> list[str]:
    """The tokenizer's special-token strings (removed from known texts before matching)."""
    return list(getattr(tokenizer, "all_special_tokens", None) or ())
