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
            tried += 1
            cancelled += outcome.cancelled
    assert tried == setup["forwards"] + setup["events"] and cancelled >= tried - 2
