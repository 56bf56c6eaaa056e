"""Model work of different runs is not queued behind one process-wide lock (issue 14).

Concurrent runs used to prefill, select and refresh one at a time: the process-wide
preparation lock was held across those forwards, whatever the model's forward slots allowed.
These tests fail if it is held across them again, or if the forward slots stop limiting
worker-side forwards to `Batching.worker_forwards` per model.
"""

from __future__ import annotations

import threading

import pytest

import rclc
from rclc import sender_from_hf, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone
# private on purpose: the forward-slot internals under test
from rclc._locks import forward_slot, set_forward_width

WAIT = 20.0  # seconds a test waits for the other thread before it calls the work serialised


def _in_thread(target, *args):
    errors: list[BaseException] = []

    def run():
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_two_selections_run_at_once(tiny):
    """Two transfers' selectors meet inside selection: neither waits for the other to finish."""
    model, tokenizer = tiny
    meeting = threading.Barrier(2, timeout=WAIT)

    @rclc.thread_safe  # a user selector takes turns unless it says so (issue 24 item 12); this one is safe
    def meeting_selector(sender, request_ids, budget):
        meeting.wait()  # BrokenBarrierError (the transfer fails) if the other selector cannot start
        return list(range(budget))

    def one_transfer(text):
        sender = sender_from_hf(model, tokenizer, text)
        transfer_sync(sender, [].append, "Who owns Cedar?", selector=meeting_selector, budget=4)

    first, first_errors = _in_thread(one_transfer, "The Cedar project is owned by Alice.")
    second, second_errors = _in_thread(one_transfer, "The Birch project is owned by Bob.")
    first.join(WAIT * 2)
    second.join(WAIT * 2)
    assert not first_errors and not second_errors, first_errors + second_errors


def test_two_readers_prefill_their_prompts_at_once(tiny):
    """Two agents' `update(prompt)` (readers' prefills) are in the model's forward together."""
    model, tokenizer = tiny
    # Each prompt alone (issue 28's batched prompt prefills would put both in one forward, which
    # test_shared_prefill.py covers): here two separate forwards must run at once in their slots.
    rclc.configure_batching(model, worker_forwards=2, prefill_batch=1, shared_prefixes=False)
    meeting = threading.Barrier(2, timeout=WAIT)

    def meet(module, args):  # BrokenBarrierError (the update fails) if the other prefill cannot start
        meeting.wait()

    handle = backbone(model).register_forward_pre_hook(meet)
    try:
        readers = [rclc.bind(model, tokenizer) for _ in range(2)]
        threads = [
            _in_thread(reader.update, f"Question: who owns it?\nDocument {index}: The project is owned by Bob.")
            for index, reader in enumerate(readers)
        ]
        for thread, _ in threads:
            thread.join(WAIT * 2)
    finally:
        handle.remove()
        rclc.configure_batching(model, rclc.Batching())
    assert not [error for _, errors in threads for error in errors]
    assert all(reader.sender_state().positions > 0 for reader in readers)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_forward_slots_admit_worker_forwards_at_once(tiny, width):
    model, _ = tiny
    rclc.configure_batching(model, worker_forwards=width)
    try:
        inside = threading.Semaphore(0)
        leave = threading.Event()
        entered = []
        lock = threading.Lock()

        def forward():
            with forward_slot(model):
                with lock:
                    entered.append(1)
                inside.release()
                leave.wait(WAIT)

        threads = [_in_thread(forward)[0] for _ in range(width + 1)]
        for _ in range(width):
            assert inside.acquire(timeout=WAIT), "fewer forwards ran at once than worker_forwards"
        assert not inside.acquire(timeout=0.3), "more forwards ran at once than worker_forwards"
        assert len(entered) == width
        leave.set()
        assert inside.acquire(timeout=WAIT)  # the last one enters once a slot is free
        for thread in threads:
            thread.join(WAIT)
    finally:
        rclc.configure_batching(model, rclc.Batching())


def test_worker_forwards_is_checked_and_reported(tiny):
    model, _ = tiny
    with pytest.raises(rclc.RclcError, match="worker_forwards"):
        rclc.Batching(worker_forwards=0)
    with pytest.raises(rclc.RclcError, match="worker_forwards"):
        rclc.configure_batching(model, worker_forwards=True)
    try:
        assert rclc.configure_batching(model, worker_forwards=3).worker_forwards == 3
        assert rclc.batching_report(model)["worker_forwards"] == 3
    finally:
        rclc.configure_batching(model, rclc.Batching())


def test_an_unchanged_width_keeps_the_slots_held(tiny):
    """Re-applying the same options (the graph's pool does, per run) must not hand out a
    fresh set of slots while forwards hold the old ones."""
    # private on purpose: the forward-slot internals under test
    from rclc._locks import _slots

    model, _ = tiny
    set_forward_width(model, 2)
    before = _slots.get(model)
    set_forward_width(model, 2)
    assert _slots.get(model) is before
    set_forward_width(model, 1)
    assert _slots.get(model) is not before and _slots.get(model).width == 1
    set_forward_width(model, 2)
