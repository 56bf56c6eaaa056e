"""Cancellation at any point (issue 6, item 2), with hypothesis choosing the point.

A run of the six-node graph (one edge with latent reasoning, so a single worker call runs
several forwards) on a tiny model is cancelled after its k-th decoder forward (from inside
that forward, as a user's Ctrl-C lands mid-step) or after its k-th event. Then
(tests/helpers/cancelling.py `check`):

- no forward starts once the stop reached the thread doing model work, but for at most the
  one generation step already being decided (stops within one model step);
- every config's attention dispatch is back to what it was;
- agents of finished nodes hold exactly the state they finished with, no half-finished
  agent is visible, and the run's agents are released;
- the stream delivers exactly one `cancelled` notice and no event of the retired epoch after it;
- no thread is left doing work (anyio's idle workers may remain, idle);
- a new run on the same pool and stream gives the uninterrupted outputs.

tests/integration/test_cancel_points.py tries every point of the graph.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cancelling import cancel_once, cancel_setup, check


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def setup(request):
    return cancel_setup(request.param)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_cancel_anywhere(setup, data):
    mode = data.draw(st.sampled_from(["forward", "event"]), label="mode")
    bound = setup["forwards"] if mode == "forward" else setup["events"]
    k = data.draw(st.integers(1, bound), label="k")
    outcome = cancel_once(setup["pool"], setup["model"], setup["plan"], mode, k)
    check(outcome, setup["model"], setup["outputs"])


def test_the_graph_does_multi_forward_work_in_one_worker_call(setup):
    # latent reasoning (3 steps) and selections run several forwards per worker call, so
    # "within one step" is not the same as "when the worker call returns"
    assert setup["forwards"] > 30 and setup["events"] > 20
