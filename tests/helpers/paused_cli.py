"""`rclc-graph` with one pause point installed, for crash and Ctrl-C tests (run as a script).

    python tests/helpers/paused_cli.py POINT MARKER -- rclc-graph arguments...

When the run reaches POINT the process writes MARKER and waits there, so the test can
send SIGKILL (or SIGINT) at exactly that point instead of racing a fast run:

    start        the run record is written, no node has finished (the first node is starting)
    after:K      the K-th node's snapshot and node file are written (K nodes finished)
    torn:K       the K-th node's snapshot is written, its node file not yet (exactly K-1
                 node files are on disk; MARKER.node names the torn node's file stem)
    forward:N    inside the N-th decoder forward of the run (mid-generation or mid-selection)

A pause waits at most --hold seconds (default: forever); it also ends as soon as the run is
cancelled (Ctrl-C), inside a worker, inside a worker that is prefilling other callers'
prompts (`serving_others` hides its own stop flag from the forward), or in the model's
batching engine (a prefill or decode step of a cancelled caller's sequence), so the
cancellation is what the test observes; it
writes MARKER with the suffix .ended saying which of the two ended it.
Nothing here is part of the package: the hooks wrap public methods from outside.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

_hidden = threading.local()  # .stop: the worker's own stop flag while it serves other callers


def _engine_cancelled(model) -> bool:
    """In a batching-engine thread (no worker of its own): whether a sequence it is
    prefilling or decoding belongs to a cancelled caller (the engine drops it after this
    forward, at its next step)."""
    from rclc.backends.hf_batching import existing_engine

    engine = existing_engine(model) if model is not None else None
    if engine is None:
        return False
    sequences = list(engine._active) + list(engine._prefilling)  # prefilling: a list since issue 28
    return any(sequence.gone() for sequence in sequences)


def _hidden_stop_set() -> bool:
    """Whether this thread serves other callers' prompts for a worker whose own caller was
    cancelled (the forward itself ignores that flag on purpose; the pause must not)."""
    event = getattr(_hidden, "stop", None)
    return event is not None and event.is_set()


def _see_through_serving_others() -> None:
    """Wrap the flat combiner's `serving_others` (prompt prefills and request captures) so a
    pause inside it still sees its worker's stop flag (a Ctrl-C landing while one thread
    prefills a batch of prompts or captures a batch of transfers)."""
    # private on purpose: the worker thread's cancellation internals under test
    from rclc import _flat_combining, _worker

    original = _flat_combining.serving_others

    @contextmanager
    def serving_others():
        saved = getattr(_hidden, "stop", None)
        _hidden.stop = _worker.current_stop()
        try:
            with original():
                yield
        finally:
            _hidden.stop = saved

    _flat_combining.serving_others = serving_others


def _pause(marker: Path, hold: float | None, model=None) -> None:
    # private on purpose: the worker thread's cancellation internals under test
    from rclc._worker import stop_requested

    temporary = marker.with_suffix(".tmp")
    temporary.write_text(str(os.getpid()))
    os.replace(temporary, marker)
    deadline = None if hold is None else time.monotonic() + hold
    while deadline is None or time.monotonic() < deadline:
        if stop_requested() or _hidden_stop_set() or _engine_cancelled(model):
            _ended(marker, "cancelled")
            return
        time.sleep(0.01)
    _ended(marker, "held")


def _ended(marker: Path, how: str) -> None:
    """Say how the pause ended (MARKER.ended: cancelled, or held to its end), so a test tells
    a cancellation from a hold that ran out without timing anything."""
    marker.with_suffix(".ended").write_text(how)


def _install(point: str, marker: Path, hold: float | None) -> None:
    from rclc_graph.run.record import recording as recorded, writer as recorder

    kind, _, value = point.partition(":")
    if kind == "start":
        original_run = recorded.RecordingExecutor.run_node

        async def run_node(self, ctx, node, inbound):
            _pause(marker, hold)
            return await original_run(self, ctx, node, inbound)

        recorded.RecordingExecutor.run_node = run_node
    elif kind == "after":
        wanted = int(value)
        original_save = recorder.RunRecorder.save_node
        saved = [0]

        async def save_node(self, result, agent):
            await original_save(self, result, agent)
            saved[0] += 1
            if saved[0] == wanted:
                _pause(marker, hold)

        recorder.RunRecorder.save_node = save_node
    elif kind == "torn":
        wanted = int(value)
        original_write = recorder.write_json_atomic
        written = [0]
        # Node files are written from worker threads, so two may be in flight at once. One lock
        # around counting and writing makes "the K-th" exact: when the K-th pauses, the K-1
        # before it are on disk and no later one can land while it waits (stop 34's landing CI
        # killed a run whose second node file was counted but not yet written).
        in_order = threading.Lock()

        def write_json_atomic(path, data):
            if Path(path).parent.name != recorder.NODES_DIR:
                return original_write(path, data)
            with in_order:
                written[0] += 1
                if written[0] == wanted:
                    # the snapshot is on disk, the node file is not; say whose it is
                    marker.with_suffix(".node").write_text(Path(path).stem)
                    _pause(marker, hold)
                return original_write(path, data)

        recorder.write_json_atomic = write_json_atomic
    elif kind == "forward":
        wanted = int(value)
        # private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
        from rclc._cache import backbone
        from rclc_graph.executors import pool

        original_load = pool.ModelPool._load
        seen = [0]

        def load(key):
            loaded = original_load(key)
            model = loaded.model

            def hook(module, args):
                seen[0] += 1
                if seen[0] == wanted:
                    _pause(marker, hold, model)

            backbone(model).register_forward_pre_hook(hook)
            return loaded

        pool.ModelPool._load = staticmethod(load)
        _see_through_serving_others()
    else:
        raise SystemExit(f"unknown pause point {point!r}")


def main() -> int:
    arguments = sys.argv[1:]
    hold = None
    if arguments[:1] == ["--hold"]:
        hold, arguments = float(arguments[1]), arguments[2:]
    point, marker, separator, *cli = arguments
    assert separator == "--", "usage: paused_cli.py [--hold S] POINT MARKER -- ARGS..."
    _install(point, Path(marker), hold)
    from rclc_graph.views.cli import main as cli_main

    return cli_main(cli)


if __name__ == "__main__":
    sys.exit(main())
