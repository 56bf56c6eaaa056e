"""Request captures of transfers that wait for a model together, folded in one forward
(issue 28, `rclc.selectors._shared_capture`): each transfer's folds are what its capture
alone gives, a failing transfer fails alone, a cancelled caller costs the others nothing,
and `capture_batch=1` captures each transfer in its own forward as before.

"Together" is made deterministic: the test holds the model's only forward slot while the
transfers' threads queue, so every one of them is waiting before any capture runs."""

from __future__ import annotations

import threading

import pytest
import torch

import rclc
# private on purpose: the combiner under test, its statistics and its queue
from rclc.selectors import _shared_capture
from rclc.selectors._shared_capture import shared_capture
# private on purpose: the folds the combiner hands back (votes, energy, row energy)
from rclc.selectors._support import SupportFold, request_fold, request_folds
from rclc.errors import CaptureError
from tests.helpers.combining import queued_together
from tests.helpers.selector_inputs import make_sender, request

OTHER = "Birch is owned by Bob. It launched in Lima on 9 June 2019, two years before Cedar."
SHORT = "Cedar: Alice."
THIRD = "Dunmore is owned by Carla, who moved to Oslo in 2021 and still lives there."


def run_together(model, jobs, stops=None):
    """Run `jobs` (callables that capture) so that all of them queue before any capture runs."""
    return queued_together(model, shared_capture(model), jobs, stops)


def assert_same_fold(found: SupportFold, expected: SupportFold) -> None:
    # The tolerances of test_capture_batch.py's fan-in check: the batched projections may
    # round a row differently from a capture alone on some BLAS.
    torch.testing.assert_close(found.votes_mean(), expected.votes_mean(), rtol=1e-5, atol=1e-7)
    assert (found.energy is None) == (expected.energy is None)
    if expected.energy is not None:
        torch.testing.assert_close(found.energy, expected.energy, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(found.row_energy, expected.row_energy, rtol=1e-4, atol=1e-6)


@pytest.fixture
def recorded_forwards(monkeypatch):
    """Senders per capture forward the combiner runs."""
    sizes: list[int] = []
    original = _shared_capture.capture_each

    def counting(model, items):
        sizes.append(len(items))
        return original(model, items)

    monkeypatch.setattr(_shared_capture, "capture_each", counting)
    return sizes


def inputs(model, tokenizer):
    fan_in = [make_sender(model, tokenizer), make_sender(model, tokenizer, OTHER), make_sender(model, tokenizer, SHORT)]
    fan_in_ids = [request(tokenizer), request(tokenizer, "Who owns Birch?"), request(tokenizer, "Owner of Cedar, and where?")]
    single = make_sender(model, tokenizer, THIRD)
    single_ids = request(tokenizer, "Where does the owner of Dunmore live?")
    return fan_in, fan_in_ids, single, single_ids


def test_transfers_waiting_together_are_captured_in_one_forward_each_with_its_own_folds(tiny, recorded_forwards):
    model, tokenizer = tiny
    fan_in, fan_in_ids, single, single_ids = inputs(model, tokenizer)
    expected = [request_fold(state, ids, moments=True) for state, ids in zip(fan_in, fan_in_ids)]
    expected_single = request_fold(single, single_ids, moments=False)
    recorded_forwards.clear()
    before = shared_capture(model).report()
    results = run_together(model, [
        lambda: request_folds(fan_in, fan_in_ids),
        lambda: request_fold(single, single_ids, moments=False),
        lambda: request_folds(fan_in[::-1], fan_in_ids[::-1]),
    ])
    assert recorded_forwards == [7]  # three transfers, seven senders, one forward
    for found, reference in zip(results[0], expected):
        assert_same_fold(found, reference)
    assert_same_fold(results[1], expected_single)
    for found, reference in zip(results[2], expected[::-1]):
        assert_same_fold(found, reference)
    after = shared_capture(model).report()
    assert after["transfers"] - before["transfers"] == 3 and after["senders"] - before["senders"] == 7
    assert after["batch_sizes"].get("3", 0) - before["batch_sizes"].get("3", 0) == 1


def test_a_failing_transfer_fails_alone_and_the_others_get_their_folds(tiny):
    model, tokenizer = tiny
    fan_in, fan_in_ids, single, single_ids = inputs(model, tokenizer)
    expected = request_fold(single, single_ids, moments=True)
    capture = shared_capture(model)
    too_far = [(single.past_key_values, single.positions + 40, single_ids)]  # more memory than the cache holds
    results = run_together(model, [
        lambda: capture.folds(model, too_far, SupportFold),
        lambda: capture.folds(model, [(single.past_key_values, single.positions, single_ids)], SupportFold),
    ])
    assert isinstance(results[0], CaptureError) and "fewer than" in str(results[0])
    assert_same_fold(results[1][0], expected)


def test_a_cancelled_slot_holder_still_serves_the_transfers_waiting_on_it(tiny):
    from rclc import _worker  # private on purpose: the error a cancelled worker call gets

    model, tokenizer = tiny
    fan_in, fan_in_ids, single, single_ids = inputs(model, tokenizer)
    expected = request_fold(single, single_ids, moments=True)
    cancelled = threading.Event()
    cancelled.set()
    results = run_together(
        model,
        [lambda: request_folds(fan_in, fan_in_ids), lambda: request_fold(single, single_ids, moments=True)],
        stops=[cancelled, None],
    )
    assert isinstance(results[0], _worker.WorkCancelled)
    assert_same_fold(results[1], expected)


def test_capture_batch_one_captures_each_transfer_in_its_own_forward(tiny, recorded_forwards):
    model, tokenizer = tiny
    fan_in, fan_in_ids, single, single_ids = inputs(model, tokenizer)
    before = rclc.configure_batching(model)
    rclc.configure_batching(model, capture_batch=1)
    try:
        results: list = [None, None]
        threads = [
            threading.Thread(target=lambda: results.__setitem__(0, request_folds(fan_in, fan_in_ids))),
            threading.Thread(target=lambda: results.__setitem__(1, request_fold(single, single_ids, moments=True))),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert rclc.batching_report(model)["request_captures"]["capture_batch"] == 1
    finally:
        rclc.configure_batching(model, before)
    assert sorted(recorded_forwards) == [1, 3]  # never combined, whatever the threads' timing
    assert len(results[0]) == 3 and results[1].votes is not None


def test_capture_batch_is_checked():
    with pytest.raises(rclc.RclcError, match="capture_batch"):
        rclc.Batching(capture_batch=0)
    with pytest.raises(rclc.RclcError, match="capture_batch"):
        rclc.Batching(capture_batch=True)
