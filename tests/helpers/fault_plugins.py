"""User code for the fault tests (issue 6, item 3): a selector and a reasoning method that a
topology imports with trust_code, and that misbehave while their fault is switched on.

They behave like the built-ins otherwise (cacheback; one latent step), so a run with the
faults off is an ordinary run, and a resume after switching a fault off must reproduce it.
"""

from __future__ import annotations

from typing import Any

FAULTS: set[str] = set()  # "selector", "selector_output", "reasoning"


class InjectedFault(RuntimeError):
    pass


def flaky_selector(sender: Any, request_ids: Any, budget: int) -> Any:
    from rclc.selectors import cacheback

    if "selector" in FAULTS:
        raise InjectedFault("selector fault injected")
    if "selector_output" in FAULTS:
        return [sender.positions + 5]  # a position the sender does not have
    return cacheback(sender, request_ids, budget)


def flaky_reasoning(state: Any, *, max_positions: int, request: Any = None) -> Any:
    from rclc.reasoning import latent_mass_sync

    if "reasoning" in FAULTS:
        raise InjectedFault("reasoning fault injected")
    return latent_mass_sync(state, steps=1, request=request, max_positions=max_positions)
