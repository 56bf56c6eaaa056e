"""Pooled allocation: several senders' budgets spent where the scores are highest across them.

Per-sender fitting gives every sender its own count, so in a fan-in a sender with nothing
relevant keeps as many rows as the one holding the answer. With `allocation="pooled"` the
counts are only a total: every sender keeps its protected positions (first position, latent
tail), and the rest of the total goes to the best spans of all senders ranked together.

Scores are not comparable across senders as they come: each sender's attention is a
softmax over its own state, so a longer sender spreads the same request's attention thinner.
Each sender's span means are therefore multiplied by its number of positions: a score then
reads as attention relative to a uniform spread over that sender (1 = what every position
would get if the request attended to none in particular). Measured on real fan-out readers
(benchmarks/pooled_allocation.py, 30 cases of three readers, docs/experiments.md), this
gives the reader holding the answer 36%, 39% and 43% of the r2, r4 and r8 budgets, against
its per-sender third. The first choice, dividing by the mean score of the sender's own
candidates (how far a span stands above its sender's typical position), gave it only 30%,
25% and 31%: a reader that attends to its evidence raises its own mean, so the evidence
counted for less exactly where it was.

The joint ranking keeps each sender's own span order (the normalisation is one positive
factor per sender), so each sender's share is exactly what its own keep step selects for the
count the joint ranking gives it: the pooled result is `profile.keep(count)` per sender.

With `relevance` (rclc.selectors._spans), the fraction is of the best candidate span across
all senders, in the same comparable units: a sender holding nothing near the best sends only
its protected positions, and the group's budget is not spent on it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from ..errors import RclcError
from ._common import SpanOptions, SpanProfile
from ._spans import pin_first, span_means, span_order
from .cacheback import cacheback, cacheback_profile
from .chunkkv import chunkkv, chunkkv_profile
from .qsnap import qsnap, qsnap_profile

PROFILERS: dict[Callable[..., Any], tuple[Callable[..., SpanProfile], str]] = {
    cacheback: (cacheback_profile, "span_size"),
    qsnap: (qsnap_profile, "span_size"),
    chunkkv: (chunkkv_profile, "chunk_size"),
}
"""The scoring built-ins: their profile function and the name they give the span size."""


def scoring_selector(selector: Any) -> tuple[Callable[..., SpanProfile], dict[str, Any]] | None:
    """(profile function, bound options) of a built-in attention selector (through any
    `functools.partial`, outer options winning), or None for any other selector."""
    options: dict[str, Any] = {}
    target = selector
    while isinstance(target, functools.partial):
        if target.args:
            return None
        for key, value in target.keywords.items():
            options.setdefault(key, value)
        target = target.func
    try:
        found = PROFILERS.get(target)
    except TypeError:  # unhashable callable
        return None
    return None if found is None else (found[0], options)


def profile_of(
    selector: Any,
    sender: Any,
    request_ids: torch.Tensor,
    exclude: Sequence[str | None] | None,
    span_starts: Sequence[int] | None = None,
    *,
    bridge: int | None = None,
) -> SpanProfile:
    """The span profile `selector` would keep from for `sender` and `request_ids`; `bridge`
    (not None) replaces the selector's own (a transfer bridges all its senders at once)."""
    found = scoring_selector(selector)
    if found is None:
        raise RclcError(
            "allocation: 'pooled' ranks the positions of all senders by the selector's scores, which only the built-in "
            "cacheback, qsnap and chunkkv expose; use allocation='per_sender' with this selector"
        )
    profiler, keywords = found
    size_field = next(field for function, field in PROFILERS.values() if function is profiler)
    options, extra = SpanOptions.from_keywords(keywords, size_field)
    if exclude is not None:
        options = replace(options, exclude=exclude)
    if span_starts is not None and "span_starts" not in keywords:
        options = replace(options, starts=span_starts)
    if bridge is not None:
        options = replace(options, bridge=bridge)
    return profiler(sender, request_ids, options, **extra)


def bridge_of(selector: Any) -> int:
    """The `bridge` option a built-in scoring selector was bound with (0: none, or not a built-in)."""
    found = scoring_selector(selector)
    return 0 if found is None else int(found[1].get("bridge", 0) or 0)


def candidate_scores(profile: SpanProfile) -> torch.Tensor:
    """The scores of a sender's candidate positions (neither protected nor excluded)."""
    mask = torch.ones(profile.positions, dtype=torch.bool)
    mask[profile.protected] = False
    if profile.excluded is not None:
        mask &= ~torch.tensor(profile.excluded, dtype=torch.bool)
    return profile.scores.detach().float().cpu()[mask]


def comparable(profile: SpanProfile) -> tuple[float, float]:
    """(shift, scale): a span of mean m ranks across senders by (m - shift) / scale.

    Attention relative to a uniform spread over the sender (module docstring): m times the
    sender's positions. The scale is positive, so each sender's own span order is kept."""
    return 0.0, 1.0 / max(profile.positions, 1)


def pooled_counts(profiles: Sequence[SpanProfile], counts: Sequence[int]) -> list[int]:
    """Per-sender counts that spend `sum(counts)` on the best spans across all senders.

    Every sender keeps its protected positions; spans are ranked by (excluded last, span
    mean / the sender's candidate scale, sender order, span order) and taken whole while they
    fit; the first span that does not fit gets what is left (its sender's keep step places
    that partial window around the span's peak). Never more than a sender's positions.
    """
    if len(profiles) != len(counts):
        raise RclcError(f"counts: {len(counts)} for {len(profiles)} senders")
    sizes = [profile.positions for profile in profiles]
    total = sum(counts)
    if total >= sum(sizes):
        return list(sizes)
    protected = [set(profile.protected) for profile in profiles]
    result = [len(kept) for kept in protected]
    room = total - sum(result)
    if room < 0:
        raise RclcError(
            f"budget: the senders' {total} positions cannot hold their {sum(result)} protected ones "
            "(first positions and latent tails); raise the budget"
        )
    entries: list[tuple[int, float, int, int, int, float]] = []  # (tier, -normalised mean, sender, rank, free, raw)
    # raw (unpinned) means are read only by `_relevant`; without relevance they are not computed
    # (the last tuple field never decides the order: sender and rank are unique before it)
    relevance_set = any(profile.relevance is not None for profile in profiles)
    for sender, profile in enumerate(profiles):
        pinned = pin_first(profile.scores)
        means = span_means(pinned, profile.spans).tolist()
        raw = span_means(profile.scores.detach().float().cpu(), profile.spans).tolist() if relevance_set else means
        shift, scale = comparable(profile)
        for rank, index in enumerate(span_order(pinned, profile.spans, profile.excluded)):
            start, stop = profile.spans[index]
            free = sum(1 for position in range(start, stop) if position not in protected[sender])
            if free == 0:
                continue
            tier = 1 if profile.excluded is not None and profile.excluded[start] else 0
            entries.append((tier, -(means[index] - shift) / scale, sender, rank, free, (raw[index] - shift) / scale))
    entries.sort()
    entries = _relevant(entries, profiles)
    for _tier, _score, sender, _rank, free, _raw in entries:
        if room == 0:
            break
        grant = min(free, room)
        result[sender] += grant
        room -= grant
    return result


def _relevant(entries: list[tuple[int, float, int, int, int, float]], profiles: Sequence[SpanProfile]) -> list:
    """`entries` cut by the senders' `relevance` (they share one selector, so one fraction):
    candidate spans (tier 0) at least that fraction of the best one's comparable raw mean."""
    fractions = {profile.relevance for profile in profiles}
    if fractions == {None}:
        return entries
    if len(fractions) != 1:
        raise RclcError(f"relevance: the senders of one pooled group must share it, got {sorted(map(str, fractions))}")
    relevance = fractions.pop()
    candidates = [entry for entry in entries if entry[0] == 0]
    if not candidates:
        return []
    threshold = relevance * max(entry[5] for entry in candidates)
    return [entry for entry in candidates if entry[5] >= threshold]
