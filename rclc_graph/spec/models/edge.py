"""Edges and the policies on them: how state moves from a sender to a receiver (mode, budget,
selector and its options, reasoning rows, representation, the request).

Mode-specific policy options default to None, meaning "the default for this mode"; the plan
resolves them (plan/policy.py). Keeping None here lets the spec refuse options that make no
sense for a mode (a `selector` on a `text` edge) and keeps dumped YAML minimal.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveInt,
    SerializerFunctionWrapHandler,
    Tag,
    field_validator,
    model_serializer,
    model_validator,
)

from rclc.policy import (
    ALLOCATIONS,
    ATTENTION_SELECTORS,
    BASELINE_SELECTORS,
    BUILTIN_REASONING,
    BUILTIN_SELECTORS,
    EXCLUSION_REASONS,
    EXCLUSION_UNITS,
    MODES,
    REASONING_CONTEXTS,
    REPRESENTATIONS,
    SELECTOR_OPTIONS,
    SPAN_KINDS,
)

from ..predicates import Condition
from .fields import Name, OptionValue, SpecBase, Template, builtin_or_callable, spec_error


class ReasoningSpec(SpecBase):
    """Latent reasoning rows a sender appends before it transmits (see the core's `reasoning`)."""

    method: str = Field("latent_mass", description="'latent_mass' or module:callable (needs trust_code)")
    steps: NonNegativeInt = 40
    context: Literal[REASONING_CONTEXTS] = "full"  # type: ignore[valid-type]
    budget: PositiveInt | None = Field(None, description="rows reserved; required for selected contexts")

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        return builtin_or_callable(value, "reasoning method", BUILTIN_REASONING)

    @model_validator(mode="after")
    def _budget(self) -> ReasoningSpec:
        if self.context.startswith("selected") and self.budget is None:
            raise spec_error(
                "E_POLICY",
                f"reasoning context {self.context!r} runs after selection and needs a budget",
                "set reasoning.budget to the rows to reserve (e.g. the number of steps)",
            )
        return self


_STATE_ONLY = (
    "ratio", "budget", "selector", "selector_options", "span", "max_span", "relevance", "exclude", "exclude_by",
    "allocation", "bridge",
)
SPAN_FIELDS = ("span", "max_span", "relevance", "exclude_by", "bridge")
"""The policy fields that are also selector options (`ResolvedPolicy.options` passes the set ones)."""
REQUEST_SCORING = tuple(name for name, options in SELECTOR_OPTIONS.items() if "bridge" in options)
"""The built-in selectors that score a request, so `bridge` (which extends it) applies to them:
the core's own list of which selectors take `bridge` (cacheback, qsnap)."""
OPT_IN_FIELDS = ("relevance", "exclude_by", "bridge")
"""Selection levers added later and off unless set (not measured yet): a policy that leaves them
out dumps, and so fingerprints, as it did before they existed (`TransferPolicy._dump`)."""
_PARTIAL_REASONS = ("instruction", "known", "duplicate")  # the reasons exclude_by: span changes
_NOT_TEXT = _STATE_ONLY + ("reasoning", "representation", "request")


class TransferPolicy(SpecBase):
    """How state moves along an edge.

    mode `state`: the core's receiver-conditioned compressed handoff (ratio xor budget,
    selector, reasoning, representation, request). `full`: the sender's whole state
    (reasoning and representation apply). `text`: the sender generates text that the
    receiver reads in its prompt (no state options).
    """

    mode: Literal[MODES] = "state"  # type: ignore[valid-type]
    ratio: PositiveInt | None = Field(None, description="relative budget rX: keep I + ceil((T - I) / X)")
    budget: PositiveInt | None = Field(None, description="bounded budget B: keep min(B, T)")
    selector: str | None = Field(None, description=f"{', '.join(BUILTIN_SELECTORS)} or module:callable")
    selector_options: dict[str, OptionValue] = Field(default_factory=dict, description="e.g. span_size: 4")
    span: Literal[SPAN_KINDS] | None = Field(  # type: ignore[valid-type]
        None,
        description="how cacheback, qsnap and chunkkv cut the sender into spans they keep whole: fixed (the "
        "span_size grid), sentence, paragraph or line; default: the graph's default (docs/yaml_reference.md)",
    )
    max_span: PositiveInt | None = Field(
        None, description="split spans longer than this many positions into near-equal pieces; default: the graph's"
    )
    relevance: float | None = Field(
        None, ge=0, le=1,
        description="keep only spans scoring at least this fraction of the best one (pooled: of the best across the "
        "group's senders), so a sender holding little that is relevant sends little; 0 keeps the whole budget; "
        "default: 0 (off; not measured yet)",
    )
    exclude: list[Literal[EXCLUSION_REASONS]] | None = Field(  # type: ignore[valid-type]
        None,
        description="what selection passes over: template (chat markup), instruction (the sender's system prompt and "
        "template text), known (text the receiver holds), duplicate (text an earlier sender of the same fan-in "
        "holds: the readers' shared prompt is sent once); [] passes nothing over; default: the graph's default",
    )
    exclude_by: Literal[EXCLUSION_UNITS] | None = Field(  # type: ignore[valid-type]
        None,
        description="how instruction and known exclusion pass over spans: position (cut a span where its positions "
        "change between excluded and not) or span (pass over a whole span when they cover more than half of it, none "
        "of it otherwise); default: position (span is not measured yet)",
    )
    bridge: NonNegativeInt | None = Field(
        None,
        description="how many spans of a first scoring (the best across the transfer's senders, not text the "
        "receiver holds) go in front of the request before the scoring that selects, so a question whose answer "
        "needs a fact it does not name (the owner of X -> where the owner lives) finds it; cacheback and qsnap; "
        "0: off; default: the graph's default",
    )
    allocation: Literal[ALLOCATIONS] | None = Field(  # type: ignore[valid-type]
        None,
        description="per_sender: each sender keeps its own budget; pooled: a transfer group's total goes to the best "
        "spans across its senders (cacheback, qsnap, chunkkv); default: the graph's default",
    )
    reasoning: ReasoningSpec | None = None
    representation: Literal[REPRESENTATIONS] | None = None  # type: ignore[valid-type]
    request: Template | None = Field(
        None, description="what the receiver needs (conditions selection); default: the receiver's prompt"
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Every field, less the opt-in levers left unset, so plan fingerprints and records of
        graphs that do not use them stay what they were."""
        data = handler(self)
        for name in OPT_IN_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        return None if value is None else builtin_or_callable(value, "selector", BUILTIN_SELECTORS)

    @field_validator("exclude")
    @classmethod
    def _exclude(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise spec_error("E_FIELD", f"exclude lists a reason twice: {value}", "name each reason once")
        return value

    @model_validator(mode="after")
    def _options_fit_mode(self) -> TransferPolicy:
        if self.ratio is not None and self.budget is not None:
            raise spec_error(
                "E_POLICY",
                "ratio and budget are both set",
                "keep one: ratio is relative (rX), budget is bounded (B positions)",
            )
        refused = _NOT_TEXT if self.mode == "text" else _STATE_ONLY if self.mode == "full" else ()
        present = [name for name in refused if getattr(self, name) not in (None, {})]
        if present:
            raise spec_error(
                "E_POLICY",
                f"mode {self.mode!r} does not use {', '.join(present)}",
                f"remove {', '.join(present)}, or use mode: state",
            )
        self._check_selection_fields()
        return self

    def _check_selection_fields(self) -> None:
        """span, max_span, relevance, exclude_by and allocation need a selector that has spans and
        scores; exclude_by: span needs a reason it applies to."""
        twice = [name for name in SPAN_FIELDS if getattr(self, name) is not None and name in self.selector_options]
        if twice:
            raise spec_error(
                "E_POLICY",
                f"{', '.join(twice)} is set both as a policy field and in selector_options",
                f"keep one: the policy field {twice[0]}: ..., or selector_options.{twice[0]}",
            )
        selector = self.selector
        if selector in BASELINE_SELECTORS:
            spans = [name for name in SPAN_FIELDS if getattr(self, name) is not None]
            if spans:
                raise spec_error(
                    "E_POLICY",
                    f"selector {selector!r} keeps no spans, so {', '.join(spans)} does not apply",
                    f"remove {', '.join(spans)}, or use one of {', '.join(ATTENTION_SELECTORS)}",
                )
        exclude_by = self.exclude_by or self.selector_options.get("exclude_by")
        if exclude_by == "span" and not set(self.exclude or ()) & set(_PARTIAL_REASONS):
            raise spec_error(
                "E_POLICY",
                f"exclude_by 'span' changes how {', '.join(_PARTIAL_REASONS)} exclusion pass over spans, and this "
                f"policy's exclude lists none of them (exclude: {self.exclude if self.exclude is not None else 'the default [template]'})",
                "add instruction, known or duplicate to exclude, or remove exclude_by",
            )
        bridge = self.bridge if self.bridge is not None else self.selector_options.get("bridge")
        if bridge and selector is not None and selector in BUILTIN_SELECTORS and selector not in REQUEST_SCORING:
            raise spec_error(
                "E_POLICY",
                f"bridge extends the request a selector scores, and selector {selector!r} scores none",
                f"use one of {', '.join(REQUEST_SCORING)}, or remove bridge",
            )
        if self.allocation == "pooled" and selector is not None and selector not in ATTENTION_SELECTORS:
            raise spec_error(
                "E_POLICY",
                f"allocation 'pooled' ranks every sender's positions by the selector's scores; selector {selector!r} has none",
                f"use one of {', '.join(ATTENTION_SELECTORS)}, or allocation: per_sender",
            )


def _policy_kind(value: Any) -> str:
    return "named" if isinstance(value, str) else "inline"


PolicyRef = Annotated[
    Union[Annotated[TransferPolicy, Tag("inline")], Annotated[Name, Tag("named")]],
    Discriminator(_policy_kind),
]

class EdgeSpec(SpecBase):
    """A handoff from `source` to `target`. `policy` is inline or the name of a graph policy.

    Without `policy`, an edge between two agents hands over `state` (the default policy) and an
    edge into or out of a function node carries the sender's text (a function holds no model
    state); `plan/validate.py` resolves it, so the spec keeps what the user wrote.

    `rounds: k` marks a loop edge: it feeds round r of its loop into round r + 1, and the
    loop is unrolled k times at compile time. Every cycle must pass through a loop edge.
    `when` makes the edge conditional on the sender's output; `until` (on a loop edge)
    stops the loop after the first round whose sender output satisfies it
    (spec/predicates.py is the condition language).
    """

    source: Name
    target: Name
    description: str = ""
    policy: Optional[PolicyRef] = Field(
        None,
        description="inline policy or the name of a graph policy; omitted: state (CacheBack r4) between two agents, "
        "text when either end is a function node",
    )
    rounds: PositiveInt | None = None
    when: Condition | None = Field(None, description="fire only when the sender's output satisfies this condition")
    until: Condition | None = Field(
        None, description="on a loop edge: stop the loop after the first round whose sender output satisfies this"
    )

    @model_validator(mode="after")
    def _until_needs_rounds(self) -> EdgeSpec:
        if self.until is not None and self.rounds is None:
            raise spec_error("E_LOOP", "until is set on an edge without rounds",
                         "put until on the loop edge that leads back (the one with rounds: k)")
        return self
