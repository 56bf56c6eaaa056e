"""Receiver-aware selection: checking `exclude=`/`allocation=`, each sender's exclusion mask
per request, and pooling a group's budget across senders (the transfer reaches them through
`rclc.selectors.transfer_steps`).

Kept apart from `rclc.exclusion` because it reads sender states and tokenizers (torch), while
`rclc.Exclusion` itself stays importable without torch for the graph's planning code.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from .._arguments import require_entries
from ..errors import RclcError
from ..exclusion import Exclusion, known_grams, known_positions, position_reasons, strip_markers
from ..policy import ALLOCATIONS
from ..state import SenderState
from ._bridge import bridge_profiles, check_shared_vocabulary
from ._common import SpanProfile
from ._pooling import bridge_of, pooled_counts, profile_of, scoring_selector
from ._prefetch import prefetch_folds
from ._sentences import check_span_starts, special_positions, token_pieces
from ._support import offering


def accepts_keyword(selector: Any, keyword: str) -> bool:
    """Whether `selector` takes `keyword` as a keyword argument that is not bound already
    (declared, or through `**kwargs`)."""
    target = selector
    while isinstance(target, functools.partial):
        if keyword in target.keywords:
            return False  # bound already: a transfer-level value would conflict
        target = target.func
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == keyword and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


def accepts_exclude(selector: Any) -> bool:
    """Whether `selector` takes an `exclude=` keyword (built-ins and baselines do; a custom
    selector opts in by declaring it, or `**kwargs`)."""
    return accepts_keyword(selector, "exclude")


def check_span_starts_option(span_starts: Any, totals: Sequence[int]) -> list[tuple[int, ...] | None] | None:
    """The transfer's `span_starts`: None, or one entry per sender (None, or positions of that
    sender where a run of rows begins; rclc.selectors._sentences says what they cut)."""
    if span_starts is None:
        return None
    require_entries("span_starts", span_starts, len(totals), expected="one entry per sender (None, or the positions "
                    "where a run of its rows begins)", wrong_count=f"{len(totals)} senders; give one per sender (None: no runs)")
    result: list[tuple[int, ...] | None] = []
    for index, (entry, total) in enumerate(zip(span_starts, totals)):
        try:
            result.append(None if entry is None else check_span_starts(entry, total))
        except RclcError as error:
            raise RclcError(f"span_starts[{index}]: {str(error).removeprefix('span_starts: ')}") from None
    return result


def selector_name(selector: Any) -> str:
    """The name error messages give a selector (through any `functools.partial`)."""
    target = selector
    while isinstance(target, functools.partial):
        target = target.func
    return getattr(target, "__name__", type(target).__name__)


def check_receiver_aware(exclude: Any, allocation: Any, selector: Any) -> Exclusion | None:
    """Check `exclude=` and `allocation=` against the selector (before any model work); the
    exclusion to apply, or None when it excludes nothing."""
    if exclude is not None and not isinstance(exclude, Exclusion):
        raise RclcError(
            f"exclude: expected rclc.Exclusion(...) (or None), got {type(exclude).__name__}; "
            "e.g. exclude=rclc.Exclusion(reasons=('known',))"
        )
    if allocation not in ALLOCATIONS:
        raise RclcError(f"allocation: {allocation!r} is not one of {ALLOCATIONS}")
    if allocation == "pooled" and scoring_selector(selector) is None:
        raise RclcError(
            f"allocation: 'pooled' ranks the positions of all senders by the selector's scores, which only the "
            f"built-in cacheback, qsnap and chunkkv expose; selector {selector_name(selector)} has none: use "
            "allocation='per_sender'"
        )
    check_selector(selector, exclude)
    return exclude if exclude is not None and exclude.reasons else None


def check_selector(selector: Any, exclusion: Exclusion | None) -> None:
    if exclusion is None or not exclusion.reasons or accepts_exclude(selector):
        return
    name = selector_name(selector)
    raise RclcError(
        f"exclude: selector {name} takes no exclude= keyword (or has one bound already), so it cannot pass over "
        "positions; declare `exclude=None` in your selector, drop exclude=, or use a built-in selector"
    )


def _text(tokenizer: Any, request: Any) -> str:
    if isinstance(request, str):
        return request
    if tokenizer is None:
        return ""
    ids = request[0].tolist() if isinstance(request, torch.Tensor) else list(request)
    return tokenizer.decode(ids, skip_special_tokens=True)


def receiver_grams(
    exclusion: Exclusion, request: Any, planned: Sequence[tuple[Any, torch.Tensor]], tokenizer: Any
) -> set[tuple[str, ...]]:
    """Word runs every receiver of one request holds: the request, the `known` texts, and the
    runs all planned receivers' prompts share (`planned`: (tokenizer, prompt ids) pairs)."""
    size = exclusion.min_words
    strip = strip_markers(tokenizer)
    grams = known_grams([_text(tokenizer, request), *exclusion.known], size, strip=strip)
    shared: set[tuple[str, ...]] | None = None
    for receiver_tokenizer, ids in planned:
        if receiver_tokenizer is None:
            shared = set()
            break
        text = receiver_tokenizer.decode(ids[0].tolist(), skip_special_tokens=False)
        prompt = known_grams([text], size, strip=strip_markers(receiver_tokenizer))
        shared = prompt if shared is None else shared & prompt
    return grams | (shared or set())


def sender_pieces(state: SenderState) -> list[str | None] | None:
    """The text of each position of a sender's state, None at special tokens (markers break
    word runs and are never matched text) and at continuous rows; None without IDs or tokenizer."""
    if state.token_ids is None or state.tokenizer is None:
        return None
    ids = state.token_ids.tolist()
    pieces = token_pieces(state.tokenizer, ids)
    for position in special_positions(state.tokenizer, ids):
        pieces[position] = None
    return pieces


def duplicate_flags(pieces: Sequence[list[str | None] | None], words: int) -> list[list[bool] | None]:
    """Per sender, which positions lie in a run of `words` words that an earlier sender's text
    also holds (None: the first sender, or a sender without text); `Exclusion`'s `duplicate`."""
    seen: set[tuple[str, ...]] = set()
    flags: list[list[bool] | None] = []
    for sender in pieces:
        if sender is None:
            flags.append(None)
            continue
        flags.append(known_positions(sender, seen, words) if seen else None)
        seen |= known_grams(_segments(sender), words)
    return flags


def _segments(pieces: Sequence[str | None]) -> list[str]:
    """The texts between special tokens (a word run never crosses one)."""
    texts, current = [], []
    for piece in pieces:
        if piece is None:
            texts.append("".join(current))
            current = []
        else:
            current.append(piece)
    texts.append("".join(current))
    return texts


def sender_reasons(
    state: SenderState, exclusion: Exclusion, roles: Sequence[str] | None, grams: set[tuple[str, ...]],
    duplicate: Sequence[bool] | None, pieces: list[str | None] | None,
) -> list[str | None] | None:
    """The `exclude` mask for one sender's state (None when nothing is excluded).

    Roles label the state the caller held; rows full-context reasoning appended after them
    are latent (protected anyway) and count as material. `duplicate` flags the positions an
    earlier sender holds (`duplicate_flags`); `pieces` is the state's text (`sender_pieces`),
    None when neither `known` nor `duplicate` is asked for or the state has no text.
    """
    total = state.positions
    if roles is not None and len(roles) > total:
        raise RclcError(f"exclude.roles: {len(roles)} labels for a sender of {total} positions")
    ids = None if state.token_ids is None else state.token_ids.tolist()
    special = special_positions(state.tokenizer, ids) if ids is not None and state.tokenizer is not None else []
    known = None
    if "known" in exclusion.reasons and grams and pieces is not None:
        known = known_positions(pieces, grams, exclusion.min_words)
    reasons = position_reasons(total, exclusion.reasons, roles=roles, special=special, known=known, duplicate=duplicate)
    return reasons if any(reason is not None for reason in reasons) else None


def request_masks(
    states: Sequence[SenderState],
    request: Any,
    planned: Sequence[tuple[Any, torch.Tensor]],
    exclusion: Exclusion,
) -> list[list[str | None] | None]:
    """Each sender's exclusion mask for one request (`planned`: the planned receivers'
    (tokenizer, prompt ids) for it). Runs in a worker."""
    roles = exclusion.roles or (None,) * len(states)
    texts = [sender_pieces(state) for state in states] if {"known", "duplicate"} & set(exclusion.reasons) else None
    duplicates: Sequence[list[bool] | None] = [None] * len(states)
    if texts is not None and "duplicate" in exclusion.reasons and len(states) > 1:
        duplicates = duplicate_flags(texts, exclusion.duplicate_words)
    masks = []
    for index, (state, labels) in enumerate(zip(states, roles)):
        grams = receiver_grams(exclusion, request, planned, state.tokenizer) if "known" in exclusion.reasons else set()
        pieces = None if texts is None else texts[index]
        masks.append(sender_reasons(state, exclusion, labels, grams, duplicates[index], pieces))
    return masks


def pool(
    states: Sequence[SenderState],
    ids: Sequence[torch.Tensor],
    counts: Sequence[int],
    reserve: int,
    selector: Any,
    masks: Sequence[list[str | None] | None],
    starts: Sequence[Sequence[int] | None] | None = None,
) -> tuple[list[SpanProfile | None], list[int]]:
    """Score every sender once and move the group's budget to the best spans across them
    (worker thread; like any selection, not under the preparation lock). Returns each
    sender's profile and its pooled count (reserve included)."""
    starts = [None] * len(states) if starts is None else starts
    profiles = _profiles(selector, states, ids, masks, starts)
    return list(profiles), pool_profiles(profiles, counts, reserve)


@dataclass(frozen=True)
class Bridge:
    """A transfer's bridge (rclc.selectors._bridge): its text (None without a tokenizer) and
    every sender's profile under the mixed scores (the selections keep from these, so the
    selector is not called again)."""

    text: str | None
    profiles: list[SpanProfile]


def bridge(
    states: Sequence[SenderState],
    ids: Sequence[torch.Tensor],
    selector: Any,
    masks: Sequence[list[str | None] | None],
    passed_over: Sequence[list[bool] | None],
    starts: Sequence[Sequence[int] | None],
) -> Bridge | None:
    """One bridge for the whole transfer: every sender scored with its request (and with a
    neutral one, which the bridge is chosen against: `_bridge.lifted`), the best spans across
    all of them put in front of every sender's request, every sender scored again, and the two
    scorings averaged (`_bridge.mixed`). None when the selector does not bridge or no
    span may bridge (worker thread)."""
    count = bridge_of(selector)
    if not count:
        return None
    check_shared_vocabulary(states)

    def score(requests: Sequence[torch.Tensor]) -> list[SpanProfile]:
        rounds = len(requests) // len(states)  # `bridge_profiles` may ask for two scorings at once
        return _profiles(selector, list(states) * rounds, requests, list(masks) * rounds, list(starts) * rounds)

    tokens, profiles = bridge_profiles(states, ids, count, score, passed_over)
    tokenizer = states[0].tokenizer
    text = None if not tokens or tokenizer is None else tokenizer.decode(tokens)
    return Bridge(text, profiles)


def pool_profiles(profiles: Sequence[SpanProfile], counts: Sequence[int], reserve: int) -> list[int]:
    """`pool`'s counts for profiles already scored (a bridged transfer's)."""
    return [count + reserve for count in pooled_counts(profiles, [count - reserve for count in counts])]


def bridge_flags(
    states: Sequence[SenderState], request: Any, planned: Sequence[tuple[Any, torch.Tensor]], exclusion: Exclusion | None,
) -> list[list[bool] | None]:
    """Per sender, the rows a bridge may not come from whatever the edge excludes: chat markup,
    the sender's instructions and text the receivers hold (None without an exclusion: the
    transfer knows no roles and no receivers, and `bridge_tokens` checks the request itself)."""
    if exclusion is None:
        return [None] * len(states)
    strict = replace(exclusion, reasons=("template", "instruction", "known"))
    return [None if mask is None else [reason is not None for reason in mask]
            for mask in request_masks(states, request, planned, strict)]


def _profiles(selector: Any, states: Sequence[SenderState], ids: Sequence[torch.Tensor],
              masks: Sequence[list[str | None] | None], starts: Sequence[Sequence[int] | None]) -> list[SpanProfile]:
    """Every sender's profile for its request, the request captures batched in one forward;
    never bridged per sender (`bridge` bridges the group)."""
    folds = prefetch_folds(selector, states, ids, [True] * len(states))
    offers = [(state, request, fold) for state, request, fold in zip(states, ids, folds) if fold is not None]
    with offering(offers):
        return [
            profile_of(selector, state, request, mask, span_starts, bridge=0)
            for state, request, mask, span_starts in zip(states, ids, masks, starts)
        ]
