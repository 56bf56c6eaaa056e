"""Which pieces a slot holder of a flat combiner serves (`rclc._flat_combining`): everything
waiting when forwards would share cores, and, when two forwards at once each get cores of
their own, its own piece and its share of the pieces waiting for a slot, never another
slot holder's piece. The slot holders are set up by hand, so no thread timing decides it."""

from __future__ import annotations

import os

import pytest
import torch

import rclc
from rclc import testing
from rclc._flat_combining import FlatCombiner, Piece, parallel_forwards, usable_cores


class Recording(FlatCombiner[Piece]):
    """A combiner whose forward returns each piece's index in its batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[Piece]] = []

    def compute(self, model, batch):
        self.batches.append(list(batch))
        return list(range(len(batch)))


def waiting(combiner: Recording, count: int, holders: tuple[int, ...] = ()) -> list[Piece]:
    """`count` queued pieces, those at `holders` marked as gathering under slots of their own."""
    pieces = [Piece(cancel=None) for _ in range(count)]
    combiner._pending.extend(pieces)
    combiner._holders.extend(pieces[index] for index in holders)
    return pieces


def test_without_parallel_forwards_the_first_holder_serves_every_waiting_piece():
    combiner = Recording()
    a, b, c = waiting(combiner, 3, holders=(1,))
    assert combiner._take(a, limit=8, parallel=False) == [a, b, c]
    assert combiner._pending == [] and combiner._holders == [b]


def test_with_parallel_forwards_each_holder_serves_its_own_piece_and_a_share_of_the_rest():
    combiner = Recording()
    a, b, c, d, e = waiting(combiner, 5, holders=(1,))
    first = combiner._take(a, limit=8, parallel=True)
    assert first == [a, c, d]  # b is another holder's; of c, d, e a takes ceil(3 / 2)
    assert combiner._holders == [b] and combiner._pending == [b, e]
    combiner._holders.remove(b)  # b's own call registers it again
    assert combiner._take(b, limit=8, parallel=True) == [b, e]
    assert combiner._pending == [] and combiner._holders == []


def test_a_share_never_passes_the_limit_and_skips_what_does_not_fit():
    class Small(Recording):
        def fits(self, batch, other):
            return other is not skipped

    combiner = Small()
    a, b, skipped, d, e, f = waiting(combiner, 6, holders=(1,))
    assert combiner._take(a, limit=2, parallel=True) == [a, d]
    assert combiner._pending == [b, skipped, e, f]


def test_a_holder_whose_piece_another_served_takes_nothing():
    combiner = Recording()
    (a,) = waiting(combiner, 1)
    combiner._pending.remove(a)
    assert combiner._take(a, limit=8, parallel=True) == [] and combiner._holders == []


def test_parallel_forwards_needs_two_slots_and_cores_for_both_forwards():
    model, _ = testing.tiny_model("llama", tokenizer=testing.tiny_tokenizer(), seed=3)
    cores = usable_cores()
    threads = torch.get_num_threads()
    before = rclc.configure_batching(model)
    try:
        rclc.configure_batching(model, worker_forwards=2)
        for count in sorted({1, max(1, cores // 2), cores}):
            torch.set_num_threads(count)
            assert parallel_forwards(model) is (2 * count <= cores)
            assert rclc.batching_report(model)["parallel_forwards"] is (2 * count <= cores)
        torch.set_num_threads(1)
        rclc.configure_batching(model, worker_forwards=1)
        assert parallel_forwards(model) is False
        assert rclc.batching_report(model)["parallel_forwards"] is False
    finally:
        torch.set_num_threads(threads)
        rclc.configure_batching(model, before)


@pytest.mark.parametrize("parallel", [False, True])
def test_submit_serves_a_lone_piece_in_its_own_forward(parallel, monkeypatch):
    import rclc._flat_combining as flat

    monkeypatch.setattr(flat, "parallel_forwards", lambda model: parallel)
    combiner = Recording()
    model, _ = testing.tiny_model("qwen3", tokenizer=testing.tiny_tokenizer(), seed=3)
    piece = Piece(cancel=None)
    assert combiner.submit(model, piece, limit=8) == 0
    assert combiner.batches == [[piece]] and combiner._holders == []


def test_usable_cores_without_an_affinity_call_counts_every_core(monkeypatch):
    if hasattr(os, "sched_getaffinity"):
        assert usable_cores() == len(os.sched_getaffinity(0))
        monkeypatch.delattr(os, "sched_getaffinity")
    assert usable_cores() == (os.cpu_count() or 1)
