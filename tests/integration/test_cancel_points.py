"""Every cancellation point of the six-node graph (issue 6, item 2): after each decoder
forward and after each event of a whole run, on both tiny families, with the checks of
tests/helpers/cancelling.py (within one model step, dispatch restored, agents unchanged, no event
of the retired epoch after the notice, no busy thread, a new run works)."""

from __future__ import annotations

import pytest

from tests.helpers.cancelling import cancel_once, cancel_setup, check

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_every_cancellation_point(family):
    setup = cancel_setup(family)
    tried = cancelled = 0
    for mode, bound in (("forward", setup["forwards"]), ("event", setup["events"])):
        for k in range(1, bound + 1):
            outcome = cancel_once(setup["pool"], setup["model"], setup["plan"], mode, k)
            check(outcome, setup["model"], setup["outputs"])
            # a run that finished was never asked to stop (it had fewer points than k: how
            # many forwards concurrent nodes share, in combined captures and batched
            # prefills, depends on their timing), or was asked at its end: within one step
            trigger = outcome.trigger
            assert outcome.cancelled or not trigger.requested or trigger.after_request <= 1, \
                (mode, k, trigger.forwards, trigger.after_request)
            tried += 1
            cancelled += outcome.cancelled
    assert tried == setup["forwards"] + setup["events"] and cancelled >= tried // 2
