"""Edge policies with every default filled in: what the scheduler hands to the core.

`TransferPolicy` (spec) keeps None for "the default of this mode" so YAML stays minimal and
the spec can refuse options a mode does not use. `ResolvedPolicy` is the frozen, complete
value a plan carries; the scheduler reads it without knowing any defaults. The defaults and
labels are the transfer core's own (`rclc.policy`, which imports no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rclc.policy import (
    BUILTIN_REASONING,
    BUILTIN_SELECTORS,
    DEFAULT_RATIO,
    DEFAULT_REPRESENTATION,
    DEFAULT_SELECTOR,
    MODES,
    policy_label,
)

from ..spec.models import TransferPolicy

Mode = Literal[MODES]  # type: ignore[valid-type]


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

    @property
    def label(self) -> str:
        """Short tag for tables: r4, b128, full or text (`rclc.policy.policy_label`)."""
        return policy_label(self.mode, self.ratio, self.budget)

    @property
    def options(self) -> dict[str, Any]:
        """The selector's keyword options as a dict."""
        return dict(self.selector_options)

    def user_code(self) -> tuple[tuple[str, str], ...]:
        """(field, "module:callable") pairs this policy would import; they need trust_code."""
        found = []
        if self.selector is not None and self.selector not in BUILTIN_SELECTORS:
            found.append(("selector", self.selector))
        if self.reasoning is not None and not self.reasoning.builtin:
            found.append(("reasoning.method", self.reasoning.method))
        return tuple(found)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (plan descriptions and records)."""
        return {
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
        }


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
    return ResolvedPolicy(
        mode="state",
        ratio=ratio,
        budget=policy.budget,
        selector=policy.selector or DEFAULT_SELECTOR,
        selector_options=tuple(sorted(policy.selector_options.items())),
        reasoning=reasoning,
        representation=representation,
        request=policy.request,
        name=name,
    )
