"""What every built-in selector shares: argument checks, guards and the check-score-keep step.

The contracts are the design spec's (shared/design/rclc_spec.md#41-public-shape,
#5-qsnap-selector-mean-query-attention-cacheback-without-correction and
#6-chunkkv-selector-request-agnostic-baseline); docs/api.md#budgets-and-chains says what users see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._arguments import is_exact_int, require_entries, require_int
from ..errors import ContextLimitError, RclcError
from ..models import context_limit_of
from ..policy import EXCLUSION_UNITS
from ..state import SenderState
from ._sentences import check_max_span, check_span_option, check_span_starts, partition
from ._bridge import bridge_profiles
from ._spans import Span, check_bridge, check_relevance, keep_spans, protected_positions, refine


def check_sender(sender: Any) -> SenderState:
    if not isinstance(sender, SenderState):
        raise RclcError(f"sender: expected a SenderState, got {type(sender).__name__}")
    sender.validate()
    return sender


def check_request_ids(request_ids: Any) -> torch.Tensor:
    if (
        not isinstance(request_ids, torch.Tensor)
        or request_ids.dtype != torch.int64
        or request_ids.dim() != 2
        or request_ids.shape[0] != 1
        or request_ids.shape[1] < 1
    ):
        described = (
            f"{request_ids.dtype} {tuple(request_ids.shape)}"
            if isinstance(request_ids, torch.Tensor)
            else type(request_ids).__name__
        )
        raise RclcError(f"request_ids: expected a non-empty int64 tensor shaped [1, n], got {described}")
    return request_ids


def check_span_size(span_size: Any, span_field: str = "span_size") -> int:
    """`span_field` names the option as the caller spelled it (ChunkKV calls it chunk_size)."""
    if not is_exact_int(span_size) or span_size < 1:
        alias = "" if span_field == "span_size" else " (the span_size of the keep step)"
        raise RclcError(f"{span_field}: expected an int >= 1{alias}, got {span_size!r}")
    return span_size


def selects(sender: SenderState, budget: Any, span_size: Any, *, span_field: str = "span_size") -> bool:
    """Validate the span size and budget; False when the budget already covers every row."""
    check_span_size(span_size, span_field)
    require_int("budget", budget, minimum=1)
    if budget < sender.latent_steps + 1:
        raise RclcError(
            f"budget: {budget} cannot cover the first position and the {sender.latent_steps}-row latent tail; "
            f"it must be at least {sender.latent_steps + 1}"
        )
    return budget < sender.positions


def check_context(sender: SenderState, request_ids: torch.Tensor, selector_name: str) -> None:
    limit = context_limit_of(sender.model)
    needed = sender.positions + int(request_ids.shape[1])
    if needed > limit:
        raise ContextLimitError(
            f"{selector_name}: the sender state ({sender.positions} positions) plus the request "
            f"({request_ids.shape[1]} tokens) exceeds the model's context limit of {limit}; "
            "shorten the request or the sender state"
        )


def check_finite(scores: torch.Tensor, selector_name: str) -> None:
    if not bool(torch.isfinite(scores).all()):
        raise RuntimeError(
            f"{selector_name}: scores contain NaN or infinity (the model produced non-finite attention); "
            "check the sender's cache and the model's dtype"
        )


def request_scores(
    sender: SenderState, request_ids: Any, name: str, score: Callable[[SenderState, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """`score(sender, request_ids)` once the request is valid and fits after the sender's state."""
    check_request_ids(request_ids)
    check_context(sender, request_ids, name)
    return score(sender, request_ids)


def check_exclude(exclude: Any, total: int) -> list[str | None] | None:
    """The `exclude` option: None, or one entry per position, None where nothing excludes it
    and the reason (a non-empty string) where something does (`rclc.Exclusion` builds them)."""
    if exclude is None:
        return None
    require_entries("exclude", exclude, total, expected="one entry per sender position (None, or the reason it is "
                    "passed over)", wrong_count=f"a sender of {total} positions; give one per position")
    for reason in exclude:
        if reason is not None and (not isinstance(reason, str) or not reason):
            raise RclcError(f"exclude: entries must be None or a non-empty reason string, got {reason!r}")
    return list(exclude)


def excluded_flags(exclude: Sequence[str | None] | None) -> list[bool] | None:
    """One flag per position (None when nothing is excluded)."""
    if exclude is None or all(reason is None for reason in exclude):
        return None
    return [reason is not None for reason in exclude]


def check_exclude_by(exclude_by: Any) -> str:
    """The `exclude_by` option: one of `rclc.policy.EXCLUSION_UNITS`."""
    if exclude_by not in EXCLUSION_UNITS:
        raise RclcError(f"exclude_by: expected one of {', '.join(map(repr, EXCLUSION_UNITS))} (how instruction and "
                        f"known exclusion pass over spans), got {exclude_by!r}")
    return exclude_by


def whole_span_flags(spans: Sequence[Span], exclude: Sequence[str | None]) -> list[bool] | None:
    """Exclusion flags for `exclude_by="span"`: chat markup (`template`) is passed over position
    by position, as always; any other reason passes over a whole span when it covers more than
    half of the span's other positions, and none of it otherwise.

    Why an option: `known` matches runs of words the receiver holds, which inside a document
    sentence ("975 people work for the Falcon studio." against "How many people work for the
    Lemur cooperative?") are a part of the sentence; cutting them out leaves orphan fragments
    ("975", "Falcon studio.") that rank as spans of their own and reach the receiver without the
    words that give them meaning. Passing spans over whole avoids that, but changes selections
    and has not been measured against the default (`exclude_by="position"`, the seed's rule).
    """
    flags = [reason == "template" for reason in exclude]
    for start, stop in spans:
        others = [p for p in range(start, stop) if exclude[p] != "template"]
        passed = sum(1 for p in others if exclude[p] is not None)
        if others and 2 * passed > len(others):
            for position in others:
                flags[position] = True
    return flags if any(flags) else None


@dataclass(frozen=True)
class SpanOptions:
    """How a built-in selector cuts a sender into the spans it keeps whole, and what it passes
    over: the options every built-in takes, as one value.

    `span`: "fixed" (the `size` grid), "sentence", "paragraph" or "line"; `max_span` splits
    longer spans; `exclude`: None, or one entry per position (None, or why it is passed over);
    `starts`: positions where a run of the sender's rows begins (text-aligned spans do not
    cross them); `size_field`: the name the caller gave `size` (ChunkKV says chunk_size), for
    error messages; `relevance`: None, or the fraction of the best span's score a span needs
    to be kept (`keep_spans`); `exclude_by`: "position" (spans are cut where exclusion flags
    change, as the seed's keep step defines) or "span" (`whole_span_flags`); `bridge`: how many
    spans of a first scoring extend the request before the scoring that selects (0: off;
    rclc.selectors._bridge; only the selectors that score a request take it). (They used to
    travel as loose keywords through four layers of every selector, each layer re-listing them.)
    """

    span: Any = "fixed"
    size: Any = 16
    max_span: Any = None
    exclude: Any = None
    starts: Any = None
    size_field: str = "span_size"
    relevance: Any = None
    exclude_by: Any = "position"
    bridge: Any = 0

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any], size_field: str = "span_size") -> tuple[SpanOptions, dict[str, Any]]:
        """(the span options among a selector's keyword options, the rest): for options bound
        with `functools.partial`, as pooled allocation reads them."""
        rest = dict(keywords)
        values = {name: rest.pop(keyword) for name, keyword in (("span", "span"), ("size", size_field),
                  ("max_span", "max_span"), ("exclude", "exclude"), ("starts", "span_starts"),
                  ("relevance", "relevance"), ("exclude_by", "exclude_by"), ("bridge", "bridge")) if keyword in rest}
        return cls(**values, size_field=size_field), rest

    def check(self, sender: SenderState) -> tuple[list[bool] | None, tuple[int, ...] | None]:
        """Check every option against `sender` (before any model work); (the exclusion flags,
        the run starts) normalised."""
        check_span_option(sender, self.span)
        check_span_size(self.size, self.size_field)
        check_max_span(self.max_span)
        check_relevance(self.relevance)
        check_exclude_by(self.exclude_by)
        check_bridge(self.bridge)
        starts = check_span_starts(self.starts, sender.positions)
        return excluded_flags(check_exclude(self.exclude, sender.positions)), starts

    def spans(self, sender: SenderState) -> tuple[list[Span], list[bool] | None]:
        """The sender's spans (cut at exclusion boundaries) and its exclusion flags."""
        flags, starts = self.check(sender)
        spans = partition(sender, self.span, self.size, self.max_span, starts)
        if flags is not None and self.exclude_by == "span":
            flags = whole_span_flags(spans, self.exclude)
        return refine(spans, flags), flags


@dataclass(frozen=True)
class SpanProfile:
    """What the keep step needs of one sender: its scores, its spans (cut at exclusion
    boundaries), which positions are excluded and its latent tail. `keep(budget)` is the
    selection the selector returns for that budget; pooled allocation ranks the spans of
    several senders' profiles together."""

    scores: torch.Tensor
    spans: list[Span]
    excluded: list[bool] | None
    latent_steps: int
    relevance: float | None = None

    @property
    def positions(self) -> int:
        return int(self.scores.shape[0])

    @property
    def protected(self) -> list[int]:
        return protected_positions(self.positions, self.latent_steps)

    def keep(self, budget: int, *, relevant_only: bool = True) -> list[int]:
        """The selection for `budget`; `relevant_only=False` ignores `relevance` (pooled
        allocation applies it across senders before it calls keep)."""
        relevance = self.relevance if relevant_only else None
        return keep_spans(self.scores, budget, self.spans, self.latent_steps, self.excluded, relevance)


Scores = Callable[[list[Span]], torch.Tensor]
"""A selector's model work: one score per sender position, given the spans it will keep from."""


def span_profile(sender: Any, options: SpanOptions, *, name: str, scores: Scores) -> SpanProfile:
    """Check the options, cut the sender into spans and score them (`scores(spans)` does the
    selector's model work); non-finite scores are refused."""
    check_sender(sender)
    spans, flags = options.spans(sender)
    scored = scores(spans)
    check_finite(scored, name)
    return SpanProfile(scored, spans, flags, sender.latent_steps, check_relevance(options.relevance))


def keep_best_spans(sender: Any, budget: Any, options: SpanOptions, profile: Callable[[], SpanProfile]) -> list[int]:
    """The check-score-keep step of every built-in selector, as ascending kept positions.

    Checks the sender, the span options, the exclusion mask and the budget before any model
    work; returns every position when the budget already covers the state; otherwise asks
    `profile()` for the selector's profile (its model work, which checks its own inputs first:
    one `span_profile`, or two scorings for a bridged selection) and keeps whole spans of the
    partition in descending score order (`keep_spans`), excluded spans last, first position
    and latent tail always included.
    """
    check_sender(sender)
    options.check(sender)
    if not selects(sender, budget, options.size, span_field=options.size_field):
        return list(range(sender.positions))
    return profile().keep(budget)


RequestScore = Callable[[SenderState, torch.Tensor], torch.Tensor]


def request_selector(
    public_name: str, name: str, score: RequestScore, summary: str, module: str
) -> tuple[Callable[..., list[int]], Callable[..., SpanProfile]]:
    """(the selector, its profile function) of a built-in that scores the request's attention
    (CacheBack, QSnap): one signature for both, written once. The profile function takes
    `(sender, request_ids, options: SpanOptions)`; pooled allocation ranks what it returns."""

    def select(
        sender: SenderState,
        request_ids: torch.Tensor,
        budget: int,
        *,
        span_size: int = 16,
        span: str = "fixed",
        max_span: int | None = None,
        exclude: Sequence[str | None] | None = None,
        span_starts: Sequence[int] | None = None,
        relevance: float | None = None,
        exclude_by: str = "position",
        bridge: int = 0,
    ) -> list[int]:
        options = SpanOptions(span, span_size, max_span, exclude, span_starts, relevance=relevance,
                              exclude_by=exclude_by, bridge=bridge)
        return keep_best_spans(sender, budget, options, lambda: profile(sender, request_ids, options))

    def scored(sender: SenderState, request_ids: Any) -> torch.Tensor:
        return request_scores(sender, request_ids, name, score)

    def profile(sender: SenderState, request_ids: torch.Tensor, options: SpanOptions) -> SpanProfile:
        def one(request: torch.Tensor) -> SpanProfile:
            return span_profile(sender, options, name=name, scores=lambda spans: scored(sender, request))

        if not options.bridge:
            return one(request_ids)
        check_request_ids(request_ids)
        _tokens, [chosen] = bridge_profiles([sender], [request_ids], options.bridge,
                                            lambda requests: [one(request) for request in requests])
        return chosen

    select.__name__ = select.__qualname__ = public_name
    select.__doc__ = summary + _SPAN_OPTIONS_DOC
    profile.__name__ = profile.__qualname__ = f"{public_name}_profile"
    select.__module__ = profile.__module__ = module  # where pickle and docs find them
    profile.__doc__ = f"Scores, spans and exclusions of `{public_name}` for one sender (what pooled allocation ranks)."
    return select, profile


_SPAN_OPTIONS_DOC = """

    Always keeps position 0 and the latent tail; `span_size`, `span` and `max_span` change
    granularity only. `span="fixed"` keeps spans of the `span_size` grid; `"sentence"`,
    `"paragraph"` and `"line"` keep whole units of the sender's text (they need the sender's
    tokenizer and token IDs); `max_span` splits longer spans. `exclude` (one entry per
    position, None or the reason) ranks the excluded positions after all others.
    `span_starts` (positions where a run of rows begins, e.g. a chain's inherited runs) also
    cut the text-aligned spans; the fixed grid ignores them. `relevance` (a fraction in (0, 1])
    keeps only spans scoring at least that fraction of the best span, so fewer than `budget`
    positions when few are relevant. `exclude_by="span"` passes over a whole span when
    instruction/known exclusion covers more than half of it (none of it otherwise) instead of
    cutting the span where the flags change (`"position"`, the default). `bridge` (an int >= 0)
    scores twice: the best `bridge` spans of the first scoring, which the request does not
    already say, are put in front of the request for the second, and spans rank by the mean of
    the two (for questions whose answer needs a fact the question does not name).
    Returns every position, without any model work, when `budget >= T`.
    """
