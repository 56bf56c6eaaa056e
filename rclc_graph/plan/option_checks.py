"""Selector options checked at validation, against what each built-in selector takes.

`selector_options: {span_size: 0}` or an option the selector does not have used to validate
and then fail inside the first selection, after the model loaded and earlier nodes ran.
The allowed options of the built-in selectors are `rclc.policy.SELECTOR_OPTIONS` (torch-free,
checked against the selectors' signatures by the core's tests). Options of a
`module:callable` selector are checked against its signature when it is imported
(run/preflight.py `check_code`).
"""

from __future__ import annotations

from rclc.policy import DEFAULT_SELECTOR, selector_option_problems

from ..errors import Problem
from ..spec.models import GraphSpec, TransferPolicy


def option_problems(spec: GraphSpec) -> list[Problem]:
    """E_POLICY for every selector option a built-in selector does not take or cannot use."""
    places: list[tuple[tuple[str | int, ...], TransferPolicy]] = [
        (("policies", name), policy) for name, policy in spec.policies.items()
    ]
    places += [
        (("edges", index, "policy"), edge.policy) for index, edge in enumerate(spec.edges)
        if isinstance(edge.policy, TransferPolicy)
    ]
    problems = []
    for path, policy in places:
        if policy.mode != "state" or not policy.selector_options:
            continue
        selector = policy.selector or DEFAULT_SELECTOR
        for option, message, fix in selector_option_problems(selector, dict(policy.selector_options)):
            problems.append(Problem("E_POLICY", message, fix, path + ("selector_options", option)))
    return problems
