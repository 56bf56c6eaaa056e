"""The persisted event log of a run directory (issue 15, item 2): ids over the run's whole
life, whole lines only, and a writer killed with SIGKILL mid-write never breaks reading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

from rclc_graph.results import run_events as ev
from rclc_graph.run.event_log import EVENT_LOG, EventLogWriter, LogReader, read_events


def token(index: int, text: str = "tok") -> ev.RunEvent:
    return ev.TokenGenerated(run_id="r", seq=index, node="n", index=index, text=text)


def write(run_dir, events, **options):
    async def main():
        writer = EventLogWriter(run_dir, **options).open()
        try:
            return [await writer.append(event) for event in events]
        finally:
            writer.close()
    return anyio.run(main)


def test_ids_continue_across_writers_and_events_read_back_typed(tmp_path):
    assert write(tmp_path, [token(0), token(1)]) == [1, 2]
    assert write(tmp_path, [token(0, "again")]) == [3]  # a resumed run appends to the same log
    lines = read_events(tmp_path)
    assert [line["id"] for line in lines] == [1, 2, 3]
    assert ev.event_from_dict(lines[2]) == token(0, "again")
    assert [line["id"] for line in read_events(tmp_path, after=2)] == [3]


def test_a_torn_last_line_is_invisible_to_readers_and_cut_by_the_next_writer(tmp_path):
    write(tmp_path, [token(0)])
    with open(tmp_path / EVENT_LOG, "ab") as handle:
        handle.write(b'{"id":2,"type":"tok')  # what a kill mid-write could leave
    assert [line["id"] for line in read_events(tmp_path)] == [1]
    assert write(tmp_path, [token(1)]) == [2]
    assert [line["text"] for line in read_events(tmp_path)] == ["tok", "tok"]
    assert (tmp_path / EVENT_LOG).read_bytes().count(b"\n") == 2


def test_the_reader_tails_whole_lines_only(tmp_path):
    reader = LogReader(tmp_path)
    assert reader.read_new() == []
    write(tmp_path, [token(0)])
    with open(tmp_path / EVENT_LOG, "ab") as handle:
        handle.write(b'{"id":2,"type":"token","run_id":"r","seq":1,')
    assert [line["id"] for line in reader.read_new()] == [1]
    with open(tmp_path / EVENT_LOG, "ab") as handle:
        handle.write(b'"node":"n","index":1,"text":"x"}\n')
    assert [line["id"] for line in reader.read_new()] == [2]
    assert reader.read_new() == []
    late = LogReader(tmp_path, after=1)  # Last-Event-ID: 1
    assert [line["id"] for line in late.read_new()] == [2]


def test_a_line_longer_than_the_read_window_is_read_whole(tmp_path):
    write(tmp_path, [token(0, "x" * 5000), token(1)])
    reader = LogReader(tmp_path)
    assert [len(line["text"]) for line in reader.read_new(limit_bytes=1000)] == [5000]
    assert [line["id"] for line in reader.read_new(limit_bytes=1000)] == [2]


WRITER = textwrap.dedent("""
    import sys, anyio
    from rclc_graph.results.run_events import TokenGenerated
    from rclc_graph.run.event_log import EventLogWriter

    async def main():
        writer = EventLogWriter(sys.argv[1], fsync_every=10_000, fsync_seconds=60).open()
        index = 0
        while True:
            await writer.append(TokenGenerated(run_id="r", seq=index, node="n", index=index, text="w" * (index % 5000)))
            index += 1
            if index == 1:  # one event is in the log: a kill at any time after leaves one to read
                print("ready", flush=True)

    anyio.run(main)
""")


@pytest.mark.parametrize("delay", [0.05, 0.2])
def test_a_writer_killed_mid_run_leaves_a_log_that_reads(tmp_path, delay):
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert process.stdout.readline().strip() == b"ready"
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdout.close()
    lines = read_events(tmp_path)
    assert lines and [line["id"] for line in lines] == list(range(1, len(lines) + 1))
    for line in lines:
        assert len(line["text"]) == line["index"] % 5000
    tail = (tmp_path / EVENT_LOG).read_bytes().rsplit(b"\n", 1)[-1]
    if tail:  # a torn line may remain; it must not be JSON a reader would take
        with pytest.raises(json.JSONDecodeError):
            json.loads(tail)
    assert write(tmp_path, [token(0)]) == [len(lines) + 1]
