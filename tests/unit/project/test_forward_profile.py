"""benchmarks/forward_profile.py (issue 28): the per-kind totals and the timeline of busy cores
docs/performance.md quotes must add up from the recorded forwards, and the wrapper must see
the forwards rclc runs on the wrapped model while recording, and only then."""

from __future__ import annotations

import pytest
import torch

from rclc import sender_from_hf
from rclc._cache import backbone
from tests.helpers.benchmarks import load_benchmark


def _benchmark():
    return load_benchmark("forward_profile")


def test_summary_adds_kinds_and_splits_busy_time_over_stretches():
    events = [  # (thread, kind, start, end, cpu, rows)
        (1, "decode", 0.0, 1.0, 0.9, 4),
        (2, "request capture", 0.5, 2.0, 1.4, 100),
        (1, "decode", 1.0, 2.0, 0.8, 3),
    ]
    summary = _benchmark().summary(events, began=0.0, wall=2.0, stretches=2)
    assert summary["kinds"]["decode"] == {"forwards": 2, "rows": 7, "cpu_s": 1.7, "wall_s": 2.0}
    assert summary["kinds"]["request capture"]["rows"] == 100
    assert list(summary["kinds"]) == ["decode", "request capture"]  # most CPU first
    assert summary["forward_cpu_s"] == pytest.approx(3.1)
    first, second = summary["timeline"]
    assert first["cores_busy"] == {"decode": 1.0, "request capture": 0.5}
    assert second["cores_busy"] == {"decode": 1.0, "request capture": 1.0}


def test_kind_comes_from_the_nearest_named_caller():
    module = _benchmark()

    def decode_step():
        return module.kind_of_caller(depth=1)

    def capture_each():
        return decode_step()

    assert capture_each() == "decode"
    assert module.kind_of_caller(depth=1) == "other"


def test_both_halves_of_a_split_decode_step_count_as_decode(tiny):
    """A decode step of many rows runs as two halves side by side: the second half's forward
    runs in a helper thread whose stack holds `_decode_rows` but not `decode_step`. Both
    halves are decode work, so neither may land in `other`."""
    from threading import Thread

    from rclc.backends.batch_cache import BatchCache, decode_step, prefill

    model, _ = tiny
    module = _benchmark()
    log = module.ForwardLog(backbone(model))
    store = BatchCache(int(model.config.num_hidden_layers))
    for length in (5, 7):
        _, layers = prefill(model, torch.arange(1, length + 1).unsqueeze(0), None)
        store.join(layers, 8, 4)

    def beside(work):  # as the engine's own helper: the second half in another thread
        box = {}
        thread = Thread(target=lambda: box.update(result=work()))
        thread.start()
        return lambda: (thread.join(), box["result"])[1]

    log.recording = True
    with torch.no_grad():
        decode_step(model, store, [3, 4], beside=beside)
    log.recording = False
    assert len(log.events) == 2 and len({event[0] for event in log.events}) == 2  # two threads
    assert [event[1] for event in log.events] == ["decode", "decode"]


def test_log_records_forwards_only_while_recording(tiny):
    model, tokenizer = tiny
    log = _benchmark().ForwardLog(backbone(model))
    sender_from_hf(model, tokenizer, "one two three")
    assert log.events == []
    log.recording = True
    sender_from_hf(model, tokenizer, "four five six seven")
    log.recording = False
    assert log.events, "the prompt's prefill went through the wrapped decoder"
    assert sum(event[5] for event in log.events) > 0  # rows forwarded (a stored prefix may spare some)
    assert {event[1] for event in log.events} <= {*_benchmark().KINDS.values(), "other"}
    assert all(event[3] >= event[2] and event[4] >= 0 for event in log.events)
