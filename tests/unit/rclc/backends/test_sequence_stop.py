"""A sequence's stop event, read against the tokens it reports (the engine side of `Sequence`)."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import torch

from rclc.backends.hf_sequences import Sequence


class _WaiterAtOnce(queue.SimpleQueue):
    """The reported-tokens queue of a waiter that runs the instant a token is put: its
    `on_token` sets the stop event before the engine's thread takes another step. Under load
    the scheduler can interleave the two threads exactly so; here it happens every time."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self.stop = stop

    def put(self, item, block=True, timeout=None):  # noqa: ANN001 - queue.SimpleQueue's signature
        super().put(item, block, timeout)
        if item[0] == "token":
            self.stop.set()


def _sequence(stop: threading.Event) -> Sequence:
    sequence = Sequence(
        input_ids=torch.tensor([[1, 2, 3]]), inputs_embeds=None, max_new_tokens=40,
        end_tokens=frozenset({0}), chooser=SimpleNamespace(finished=False), stop=stop, cancel=None,
    )
    sequence._events = _WaiterAtOnce(stop)  # private on purpose: the waiter's side, run in step with the engine
    return sequence


def test_a_stop_set_by_a_tokens_report_ends_the_sequence_at_the_next_token():
    # The waiter refuses every token reported once it asked for the stop (a stopped run records
    # nothing), so the engine must report one more token after the stop was set; ending on the
    # token whose report set it would hand back a normal, recorded stop instead.
    stop = threading.Event()
    sequence = _sequence(stop)
    assert sequence.add(7) is False and not sequence.stopped
    assert sequence.add(8) is True and sequence.stopped
    assert [sequence._events.get_nowait() for _ in range(2)] == [("token", 7), ("token", 8)]


def test_a_stop_set_before_a_token_ends_the_sequence_on_it():
    stop = threading.Event()
    stop.set()
    sequence = _sequence(stop)
    assert sequence.add(7) is True and sequence.stopped and sequence.tokens == [7]
