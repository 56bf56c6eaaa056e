"""Edge policies with every default filled in: what the scheduler hands to the core.

`TransferPolicy` (spec) keeps None for "the default of this mode" so YAML stays minimal and
the spec can refuse options a mode does not use. `ResolvedPolicy` is the frozen, complete
value a plan carries; the scheduler reads it without knowing any defaults. The defaults and
labels are the transfer core's own (`rclc.policy`, which imports no torch), except the
selection defaults of `state` edges (span kind, exclusion, allocation): those are the graph's,
chosen from paired measurements on both shipped topologies (the comment at DEFAULT_SPAN says
which and why), while `rclc.transfer` keeps the seed's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rclc.policy import (
    ATTENTION_SELECTORS,
    BUILTIN_REASONING,
    BUILTIN_SELECTORS,
    DEFAULT_RATIO,
    DEFAULT_REPRESENTATION,
    DEFAULT_SELECTOR,
    MODES,
    policy_label,
)

from ..spec.models import TransferPolicy
from ..spec.models.edge import OPT_IN_FIELDS, REQUEST_SCORING, SPAN_FIELDS

Mode = Literal[MODES]  # type: ignore[valid-type]

# The graph layer's selection defaults for `state` edges (the core's own defaults are the
# seed's: fixed 16-wide spans, nothing excluded, per-sender budgets). Chosen from the paired
# measurements in docs/experiments.md#receiver-aware-selection-and-pooled-budgets, on both
# topologies measured (fan-out and chain, r4):
# - sentence spans: with them the evidence sentence survives (fan-out 13% -> 97-100%);
# - only chat-template markers passed over: on the fan-out this beat passing over all three
#   reasons (82% vs 56% accuracy, 45 paired cases, p = 0.004) and sentence spans alone (64%);
#   on the chain it matched the seed's CacheBack (50% vs 50% on 20 cases). Passing over the
#   sender's instructions or text the receiver holds frees budget that goes to more facts of
#   the same kind, and the 135M answerer then names a distractor: on the chain each of them
#   alone cost accuracy (30% vs 50%), all three 20-25%. They stay available per edge.
DEFAULT_SPAN = "sentence"
DEFAULT_MAX_SPAN: int | None = 32
# Off by default, not measured yet (issue 26): `relevance` (keep less when less is relevant) and
# `exclude_by: span` (instruction/known exclusion passes over whole spans). None: not passed to
# the selector, whose own defaults are the same (the whole budget; position by position).
DEFAULT_RELEVANCE: float | None = None
DEFAULT_EXCLUDE_BY: str | None = None
DEFAULT_EXCLUDE: tuple[str, ...] = ("template",)
# Pooled fan-in budgets (issue 26): the senders of one transfer group share the sum of their
# budgets, spent on the best spans across them. Chosen on the fan-out dev split (seed 101, 80
# cases in each of four task families, r4): 46.2% against 40.3% for per-sender budgets,
# +37/-18 paired, p = 0.014 (paraphrase +19/-2), gold-sentence evidence kept 72% against 64%;
# docs/experiments.md#task-families-dev-split-r4. A chain hop has one sender, so nothing changes
# there. A group whose senders sit on other replicas than the receiver cannot pool (the ranking
# needs every score in one place): there the default falls back to per-sender budgets, and an
# edge that names `allocation: pooled` is refused (executors/fitting.py).
DEFAULT_ALLOCATION = "pooled"
# Bridging (issue 26): the selectors that score a request (cacheback, qsnap) score twice, the
# distinctive tokens of the first scoring's best span across the transfer's senders in front of
# the request for the second. On the fan-out dev split it answers 53.1% against 46.2% (+41/-19,
# p = 0.006; two-hop 31.2% against 0.0%), but a lone sender's bridge cost the chain's
# single-fact dev cases (42.5% against 61.2%, p = 0.008), so the default bridge applies to
# fan-ins only (executors/transfer_options.py): a chain hop is as before.
# docs/experiments.md#bridging-a-second-fact-dev-split-r4
DEFAULT_BRIDGE = 1


@dataclass(frozen=True)
class ResolvedReasoning:
    """An edge's reasoning step with every default filled in."""

    method: str  # "latent_mass" or "module:callable"
    steps: int
    context: str  # full | full_with_request | selected | selected_with_request
    budget: int | None

    @property
    def builtin(self) -> bool:
        """Whether the method is one rclc ships (not a module:callable)."""
        return self.method in BUILTIN_REASONING

    @property
    def after_selection(self) -> bool:
        """Whether reasoning runs on the selected rows (context selected*), not the full state."""
        return self.context.startswith("selected")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (plan descriptions and records)."""
        return {"method": self.method, "steps": self.steps, "context": self.context, "budget": self.budget}


@dataclass(frozen=True)
class ResolvedPolicy:
    """A complete edge policy. For `state`, exactly one of ratio/budget is set; for `full` and
    `text` both are None, and `text` has no selector, reasoning or representation."""

    mode: Mode
    ratio: int | None = None
    budget: int | None = None
    selector: str | None = None
    selector_options: tuple[tuple[str, Any], ...] = ()
    reasoning: ResolvedReasoning | None = None
    representation: str | None = None
    request: str | None = None  # template; None means "the receiver's prompt"
    name: str | None = None  # the graph-level policy name, when the edge used one
    span: str | None = None  # how the selector cuts spans (attention selectors); None: not passed
    max_span: int | None = None
    relevance: float | None = None  # keep spans >= this fraction of the best; None: the whole budget
    exclude: tuple[str, ...] = ()  # exclusion reasons; () passes nothing over
    exclude_by: str | None = None  # "span": instruction/known pass over whole spans; None: position by position
    bridge: int | None = None  # spans of a first scoring put in front of the request; None: off
    allocation: str = "per_sender"
    # The edge named its allocation (False: the graph's default filled it). Only the remote
    # executor reads it; left out of equality, so edges that resolve to the same policy still
    # travel in one transfer call whether or not they wrote the allocation out.
    allocation_named: bool = field(default=False, compare=False)
    bridge_named: bool = field(default=False, compare=False)  # the same for `bridge`

    @property
    def label(self) -> str:
        """Short tag for tables: r4, b128, full or text (`rclc.policy.policy_label`)."""
        return policy_label(self.mode, self.ratio, self.budget)

    @property
    def options(self) -> dict[str, Any]:
        """The selector's keyword options as a dict (`span`, `max_span`, `relevance` and `exclude_by`
        included when set)."""
        options = dict(self.selector_options)
        for name in SPAN_FIELDS:
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options

    def user_code(self) -> tuple[tuple[str, str], ...]:
        """(field, "module:callable") pairs this policy would import; they need trust_code."""
        found = []
        if self.selector is not None and self.selector not in BUILTIN_SELECTORS:
            found.append(("selector", self.selector))
        if self.reasoning is not None and not self.reasoning.builtin:
            found.append(("reasoning.method", self.reasoning.method))
        return tuple(found)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (plan descriptions and records); `relevance` and `exclude_by` only when
        set, so records of policies that do not use them are what they were before they existed."""
        data = {
            "mode": self.mode,
            "label": self.label,
            "ratio": self.ratio,
            "budget": self.budget,
            "selector": self.selector,
            "selector_options": self.options,
            "reasoning": None if self.reasoning is None else self.reasoning.to_dict(),
            "representation": self.representation,
            "request": self.request,
            "name": self.name,
            "span": self.span,
            "max_span": self.max_span,
            "exclude": list(self.exclude),
            "allocation": self.allocation,
        }
        for name in OPT_IN_FIELDS:
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data


def resolve_policy(policy: TransferPolicy, name: str | None = None) -> ResolvedPolicy:
    reasoning = None
    if policy.reasoning is not None:
        spec = policy.reasoning
        reasoning = ResolvedReasoning(spec.method, spec.steps, spec.context, spec.budget)
    if policy.mode == "text":
        return ResolvedPolicy(mode="text", name=name)
    representation = policy.representation or DEFAULT_REPRESENTATION
    if policy.mode == "full":
        return ResolvedPolicy(
            mode="full", reasoning=reasoning, representation=representation, request=policy.request, name=name
        )
    ratio = policy.ratio if policy.ratio is not None or policy.budget is not None else DEFAULT_RATIO
    selector = policy.selector or DEFAULT_SELECTOR
    options = dict(policy.selector_options)
    spans = {field: getattr(policy, field) for field in SPAN_FIELDS}
    if selector in ATTENTION_SELECTORS:
        spans = _span_defaults(spans, options, request_scoring=selector in REQUEST_SCORING)
    spans["relevance"] = spans["relevance"] or None  # 0: keep the whole budget, as with no relevance at all
    spans["bridge"] = spans["bridge"] or None  # 0: off, as with no bridge at all
    builtin = selector in BUILTIN_SELECTORS
    exclude = policy.exclude if policy.exclude is not None else (DEFAULT_EXCLUDE if builtin else ())
    allocation = policy.allocation or (DEFAULT_ALLOCATION if selector in ATTENTION_SELECTORS else "per_sender")
    return ResolvedPolicy(
        mode="state",
        ratio=ratio,
        budget=policy.budget,
        selector=selector,
        selector_options=tuple(sorted(options.items())),
        reasoning=reasoning,
        representation=representation,
        request=policy.request,
        name=name,
        exclude=tuple(exclude),
        allocation=allocation,
        allocation_named=policy.allocation is not None,
        bridge_named=policy.bridge is not None or "bridge" in options,
        **spans,
    )


def _span_defaults(spans: dict[str, Any], options: dict[str, Any], *, request_scoring: bool) -> dict[str, Any]:
    """An attention selector's span fields with the graph's defaults filling what neither the
    policy field nor selector_options says (the others stay None: not passed)."""
    spans = dict(spans)
    if spans["span"] is None and "span" not in options:
        # A span_size alone asks for the grid it sizes.
        spans["span"] = "fixed" if "span_size" in options else DEFAULT_SPAN
    text_spans = options.get("span", spans["span"]) != "fixed"  # max_span and relevance cut text spans only
    defaults = {
        "max_span": DEFAULT_MAX_SPAN if text_spans else None,
        "relevance": DEFAULT_RELEVANCE if text_spans else None,
        "exclude_by": DEFAULT_EXCLUDE_BY,
        "bridge": DEFAULT_BRIDGE if request_scoring else None,
    }
    for field, default in defaults.items():
        if spans[field] is None and field not in options:
            spans[field] = default
    return spans
