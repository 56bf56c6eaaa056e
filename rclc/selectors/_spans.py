"""The keep step shared by the built-in selectors: scores -> exactly `budget` positions.

Pure function of a score vector, a span partition and the latent tail (no model), so it is
property-tested directly. Selection works on spans rather than single positions because a
receiver reads kept rows as text-like runs: isolated tokens carry little meaning, a kept
span keeps its local context. The partition is a list of `(start, stop)` spans covering
`0..T-1` in order; the built-ins use the fixed grid of `fixed_spans` or, with
`span="sentence"` (or paragraph, line), the sender's own text units (`_sentences`), and any
other partition plugs into `keep_spans` unchanged.

Receiver-aware selection (`exclude`, rclc.exclusion) adds one rule: spans are first cut where
positions change between excluded and not, and every excluded span ranks after every other
span, so excluded rows only fill what is left once the rest is kept.

`relevance` (a fraction r in (0, 1]; 0 or None: off) keeps less when less is relevant: spans are kept in
rank order only while their mean score is at least r times the best candidate span's (a
candidate: not excluded, not only protected positions; raw scores, the first position not
pinned), so a sender whose state holds one relevant sentence sends that sentence and not
`budget` positions of the next-best ones. Excluded spans are not kept at all then. The budget
stays the cap: never more than `budget` positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import RclcError

Span = tuple[int, int]  # [start, stop), stop exclusive


def fixed_spans(total: int, span_size: int) -> list[Span]:
    """`[0, W), [W, 2W), ...`; the last span keeps the remainder `total mod W`."""
    return [(start, min(start + span_size, total)) for start in range(0, total, span_size)]


def protected_positions(total: int, latent_steps: int) -> list[int]:
    """The first position (attention sink) and the current latent tail, ascending."""
    return [0, *range(max(total - latent_steps, 1), total)]


def pin_first(scores: torch.Tensor) -> torch.Tensor:
    """A float32 copy with `scores[0]` raised to the maximum, so the sink ranks with the best."""
    pinned = scores.detach().to(dtype=torch.float32, device="cpu").clone()
    pinned[0] = pinned.max()
    return pinned


def span_means(pinned: torch.Tensor, spans: Sequence[Span]) -> torch.Tensor:
    """Float32 mean of each span, dividing by the span's own size."""
    size = spans[0][1] - spans[0][0]
    uniform = all(start == i * size and stop - start == size for i, (start, stop) in enumerate(spans[:-1]))
    last_start, last_stop = spans[-1]
    if uniform and last_start == (len(spans) - 1) * size and last_stop - last_start <= size:
        full = len(spans) - 1 if last_stop - last_start < size else len(spans)
        means = pinned[: full * size].view(full, size).mean(dim=1)
        if full < len(spans):
            means = torch.cat([means, pinned[last_start:last_stop].mean().reshape(1)])
        return means
    return torch.stack([pinned[start:stop].mean() for start, stop in spans])


def _check_partition(spans: Sequence[Span], total: int) -> None:
    expected = 0
    for start, stop in spans:
        if start != expected or stop <= start:
            raise RclcError(f"spans: expected contiguous non-empty (start, stop) spans covering 0..{total - 1}")
        expected = stop
    if expected != total:
        raise RclcError(f"spans: they cover 0..{expected - 1} but the scores have {total} positions")


def _window_around_peak(available: list[int], room: int, peak: int) -> tuple[int, int]:
    """The run of `room` consecutive available positions closest to the peak.

    Ties break by a narrower run (fewer protected positions stepped over), then by the
    earlier start.
    """

    def rank(offset: int) -> tuple[float, int, int]:
        first, last = available[offset], available[offset + room - 1]
        return abs((first + last) / 2 - peak), last - first, first

    best = min(range(len(available) - room + 1), key=rank)
    return available[best], available[best + room - 1]


def refine(spans: Sequence[Span], excluded: Sequence[bool] | None) -> list[Span]:
    """`spans` cut wherever a position's excluded flag differs from the one before it."""
    if excluded is None:
        return list(spans)
    result: list[Span] = []
    for start, stop in spans:
        cut = start
        for position in range(start + 1, stop):
            if excluded[position] != excluded[position - 1]:
                result.append((cut, position))
                cut = position
        result.append((cut, stop))
    return result


def span_order(pinned: torch.Tensor, spans: Sequence[Span], excluded: Sequence[bool] | None = None) -> list[int]:
    """Span indices in keep order: descending mean of the pinned scores (ties: lower index
    first), every excluded span after every other one."""
    order = torch.sort(span_means(pinned, spans), descending=True, stable=True).indices.tolist()
    if excluded is None:
        return order
    return [i for i in order if not excluded[spans[i][0]]] + [i for i in order if excluded[spans[i][0]]]


def relevant_spans(
    scores: torch.Tensor, spans: Sequence[Span], order: Sequence[int], protected: Sequence[int],
    excluded: Sequence[bool] | None, relevance: float,
) -> list[int]:
    """`order` cut to the spans whose raw mean is at least `relevance` x the best candidate
    span's (module docstring); spans holding only protected positions stay (they are kept anyway)."""
    means = span_means(scores.detach().to(dtype=torch.float32, device="cpu"), spans).tolist()
    guarded = set(protected)
    free = [any(p not in guarded for p in range(start, stop)) for start, stop in spans]
    candidates = [i for i in range(len(spans)) if free[i] and not (excluded is not None and excluded[spans[i][0]])]
    if not candidates:
        return [i for i in order if not free[i]]
    threshold = relevance * max(means[i] for i in candidates)
    chosen = {i for i in candidates if means[i] >= threshold}
    return [i for i in order if not free[i] or i in chosen]


def check_bridge(bridge: object) -> int:
    """The `bridge` option (rclc.selectors._bridge): how many spans of a first scoring are put
    in front of the request before the scoring that selects (0: off)."""
    if isinstance(bridge, bool) or not isinstance(bridge, int) or bridge < 0:
        raise RclcError(f"bridge: expected an int >= 0 (spans of a first scoring put in front of the request; "
                        f"0: off), got {bridge!r}")
    return bridge


def check_relevance(relevance: object) -> float | None:
    """None or 0 (keep the whole budget), or a fraction in (0, 1]; returns None for "keep the
    whole budget" and the fraction otherwise."""
    if relevance is None:
        return None
    if isinstance(relevance, bool) or not isinstance(relevance, (int, float)) or not 0 <= relevance <= 1:
        raise RclcError(f"relevance: expected a number in [0, 1] (a fraction of the best span's score; 0: keep the "
                        f"whole budget), got {relevance!r}")
    return float(relevance) or None


def keep_spans(
    scores: torch.Tensor,
    budget: int,
    spans: Sequence[Span],
    latent_steps: int = 0,
    excluded: Sequence[bool] | None = None,
    relevance: float | None = None,
) -> list[int]:
    """Pin the first position, protect first + latent tail, fill `budget` with whole spans
    in descending mean order and a contiguous partial window around the peak of the span
    that overshoots. Ascending positions; exactly `budget` of them when `budget < T` (at most
    `budget` with `relevance`).

    With `excluded` (one flag per position), spans are first cut where the flag changes and
    excluded spans rank after all others; with `relevance`, spans scoring below that fraction
    of the best are not kept (module docstring).
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() != 1 or scores.shape[0] < 1:
        raise RclcError("scores: expected a non-empty 1-D tensor with one score per position")
    total = int(scores.shape[0])
    _check_partition(spans, total)
    if excluded is not None and len(excluded) != total:
        raise RclcError(f"excluded: {len(excluded)} flags for {total} positions; give one per position")
    spans = refine(spans, excluded)
    protected = protected_positions(total, latent_steps)
    if len(protected) > budget:
        raise RclcError(
            f"budget: {budget} positions cannot hold the {len(protected)} protected ones "
            f"(the first position and {latent_steps} latent rows); raise the budget"
        )
    if budget >= total:
        return list(range(total))
    pinned = pin_first(scores)
    order = span_order(pinned, spans, excluded)
    if relevance is not None:
        order = relevant_spans(scores, spans, order, protected, excluded, check_relevance(relevance))
    values = pinned.tolist()
    keep = set(protected)
    for span_index in order:
        room = budget - len(keep)
        if room == 0:
            break
        start, stop = spans[span_index]
        available = [position for position in range(start, stop) if position not in keep]
        if len(available) <= room:
            keep.update(available)
            continue
        segment = values[start:stop]
        peak = start + segment.index(max(segment))
        first, last = _window_around_peak(available, room, peak)
        keep.update(range(first, last + 1))
    return sorted(keep)


def fixed_span_keep(scores: torch.Tensor, budget: int, span_size: int, latent_steps: int = 0) -> list[int]:
    """`keep_spans` over the fixed grid of `span_size` spans aligned at 0."""
    return keep_spans(scores, budget, fixed_spans(int(scores.shape[0]), span_size), latent_steps)
