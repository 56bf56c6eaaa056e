"""Run directories that were tampered with, damaged or left by a killed process: resume and
inspect stay inside the directory, never hang, refuse swapped snapshots, show a killed run as
crashed, print no control sequence, and every file is written with one permission rule
(issue 16 items 10, 11, 12, 13, 14, 19)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import threading
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

import rclc
from rclc_graph import ModelPool, plan_file, read_resume_point, resume_run_sync, run_recorded_sync
from rclc_graph.errors import ResumeError
from rclc_graph.run import current_record
from rclc_graph.run.record import NODES_DIR, RECORD_FILE
from rclc_graph.views.cli import app

from tests.helpers.reliability import SIX_INPUTS, crash_copy, save_tiny, write_six

runner = CliRunner()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("six")
    source = save_tiny(directory / "tiny")
    topology, _ = write_six(directory, source)
    plan = plan_file(topology, SIX_INPUTS)
    pool = ModelPool()
    result, record, run_dir = run_recorded_sync(plan, directory / "runs", pool=pool, base_dir=topology.parent)
    assert result.status == "finished", result.error
    return {"plan": plan, "pool": pool, "run_dir": run_dir, "record": record, "topology": topology}


def tree(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file() and not path.is_symlink()}


def rehash(run_dir: Path, node: str, **snapshot) -> None:
    path = run_dir / NODES_DIR / f"{node}.json"
    data = json.loads(path.read_text())
    target = run_dir / NODES_DIR / Path(data["snapshot"]["file"]).name
    data["snapshot"].update(sha256=hashlib.sha256(target.read_bytes()).hexdigest(), **snapshot)
    path.write_text(json.dumps(data))


def refused(reference, run_dir: Path, match: str) -> None:
    before = tree(run_dir)
    with pytest.raises(ResumeError, match=match):
        resume_run_sync(run_dir, pool=reference["pool"])
    assert tree(run_dir) == before


# issue 16 item 10: a snapshot swapped with another node's (SHA-256 rewritten) was accepted
def test_a_swapped_snapshot_is_refused(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "swap", frozenset({"a", "b"}))
    nodes = run_dir / NODES_DIR
    shutil.copy(nodes / "b.safetensors", nodes / "a.safetensors")
    rehash(run_dir, "a")
    refused(reference, run_dir, "not this node's state")


# issue 16 item 11: resume followed snapshot.file "../../outside/x.safetensors"
def test_snapshot_paths_stay_inside_the_run_directory(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "runs" / "escape", frozenset({"a", "b"}))
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(run_dir / NODES_DIR / "a.safetensors", outside / "a.safetensors")
    path = run_dir / NODES_DIR / "a.json"
    data = json.loads(path.read_text())
    data["snapshot"]["file"] = "../../outside/a.safetensors"
    path.write_text(json.dumps(data))
    refused(reference, run_dir, "names file '../../outside/a.safetensors'")


# issue 16 item 11: resume wrote through a symlinked nodes/ directory (outside the run)
def test_a_symlinked_nodes_directory_is_refused(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "linked", frozenset({"a", "b"}))
    outside = tmp_path / "elsewhere"
    shutil.move(str(run_dir / NODES_DIR), outside)
    (run_dir / NODES_DIR).symlink_to(outside, target_is_directory=True)
    before = tree(outside)
    refused(reference, run_dir, "symbolic link")
    assert tree(outside) == before
    # a linked lock file would be truncated when locked: refused too
    (run_dir / NODES_DIR).unlink()
    shutil.move(str(outside), run_dir / NODES_DIR)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run_dir / ".lock").unlink()
    (run_dir / ".lock").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        resume_run_sync(run_dir, pool=reference["pool"])
    assert victim.read_text() == "keep me"


def _within(seconds: float, call) -> object:
    """Run `call` in a thread; fail (instead of hanging the suite) when it blocks."""
    outcome: list = []

    def target():
        try:
            outcome.append(("ok", call()))
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            outcome.append(("error", error))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the call blocked for more than {seconds} s"
    return outcome[0]


# issue 16 item 12: a FIFO in place of a node file hung resume; agent.load() on a FIFO blocked
def test_fifos_are_refused_without_blocking(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "fifo", frozenset({"a", "b"}))
    (run_dir / NODES_DIR / "a.json").unlink()
    os.mkfifo(run_dir / NODES_DIR / "a.json")
    kind, error = _within(10, lambda: read_resume_point(run_dir))
    assert kind == "error" and isinstance(error, ResumeError) and "FIFO" in str(error)
    fifo = tmp_path / "agent.safetensors"
    os.mkfifo(fifo)
    loaded = reference["pool"].get(reference["plan"].models()[0], reference["topology"].parent)
    agent = rclc.bind(loaded.model, loaded.tokenizer)
    kind, error = _within(10, lambda: anyio.run(agent.load, fifo))
    assert kind == "error" and isinstance(error, ValueError) and "FIFO" in str(error)


def _killed(reference, target: Path) -> Path:
    """What SIGKILL leaves after a, b and c finished: the start record (status running,
    nothing finished), their node files, no report, and no process holding the lock."""
    run_dir = crash_copy(reference["run_dir"], target, frozenset({"a", "b", "c"}))
    record = json.loads((run_dir / RECORD_FILE).read_text())
    record.update(nodes={}, hops=[], lineage={}, unfinished=list(reference["plan"].order))
    (run_dir / RECORD_FILE).write_text(json.dumps(record))
    return run_dir


# issue 16 item 13: inspect on a SIGKILLed run said "running", listed finished nodes as unfinished
# and linked a report.html that does not exist
def test_inspect_shows_a_killed_run_as_crashed_with_what_finished(reference, tmp_path):
    run_dir = _killed(reference, tmp_path / "killed")
    record = current_record(run_dir)
    assert record["status"] == "crashed" and "rclc-graph resume" in record["error"]
    assert list(record["nodes"]) == ["a", "b", "c"] and record["unfinished"] == ["d", "e", "final"]
    result = runner.invoke(app, ["inspect", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "crashed" in result.output and "running" not in result.output
    assert "not finished: d, e, final" in result.output and "report.html" not in result.output.replace(
        "(report.html is written when a run or resume ends)", "")
    # a run whose writer is alive still says running
    from rclc_graph.run.directory_lock import DirectoryLock

    lock = DirectoryLock(run_dir)
    lock.acquire()
    try:
        holder = _within(10, lambda: current_record(run_dir))  # another thread: filelock is per process
    finally:
        lock.release()
    assert holder[0] == "ok" and holder[1]["status"] == "running"


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r["hops"][0].update(kept_positions="x"), "hops[0].kept_positions"),
        (lambda r: r.update(nodes=[]), "nodes"),
        (lambda r: r["nodes"]["a"]["lineage"].update(segments=[["a", "prompt"]]), "nodes.a.lineage.segments[0]"),
        (lambda r: r.update(status=7), "status"),
        (lambda r: r["timings"].update(seconds="soon"), "timings.seconds"),
    ],
)
# issue 16 item 13: wrongly typed record fields gave TypeError/KeyError tracebacks
def test_wrongly_typed_record_fields_are_named(reference, tmp_path, edit, field):
    run_dir = tmp_path / "typed"
    shutil.copytree(reference["run_dir"], run_dir)
    record = json.loads((run_dir / RECORD_FILE).read_text())
    edit(record)
    (run_dir / RECORD_FILE).write_text(json.dumps(record))
    result = runner.invoke(app, ["inspect", str(run_dir)])
    assert result.exit_code == 2 and "Traceback" not in result.output and field in result.output, result.output
    with pytest.raises(ResumeError, match=field.replace("[", r"\[").replace("]", r"\]")):
        read_resume_point(run_dir)


# issue 16 item 5: a deep record.json raised RecursionError in inspect and resume
def test_a_deep_record_is_refused(reference, tmp_path):
    run_dir = tmp_path / "deep"
    shutil.copytree(reference["run_dir"], run_dir)
    (run_dir / RECORD_FILE).write_text('{"status": ' + "[" * 5000 + "]" * 5000 + "}")
    result = runner.invoke(app, ["inspect", str(run_dir)])
    assert result.exit_code == 2 and "nested more than 64 levels" in result.output
    with pytest.raises(ResumeError, match="nested"):
        read_resume_point(run_dir)


# issue 16 item 14: terminal control sequences in descriptions and outputs reached the terminal raw
def test_control_sequences_never_reach_the_terminal(reference, tmp_path):
    run_dir = tmp_path / "escapes"
    shutil.copytree(reference["run_dir"], run_dir)
    record = json.loads((run_dir / RECORD_FILE).read_text())
    record["outputs"]["final"] = "fine\x1b]0;owned\x07\x1b[2J\r\u202eevil"
    record["error"] = "boom \x9b31m"
    (run_dir / RECORD_FILE).write_text(json.dumps(record))
    result = runner.invoke(app, ["inspect", str(run_dir)])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert raw not in result.output
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x0d\\u202eevil" in result.output
    topology = tmp_path / "bad.yaml"
    topology.write_text("version: 1\nname: x\ndescription: \"\\e[31mred\"\nnodez: []\n")
    result = runner.invoke(app, ["validate", str(topology)])
    assert "\x1b" not in result.output and "nodez" in result.output


# issue 16 item 19: one permission rule: every file private (0600), directories 0700
def test_every_file_of_a_run_is_private(reference):
    mask = os.umask(0)
    os.umask(mask)
    run_dir = reference["run_dir"]
    files = [path for path in run_dir.rglob("*") if path.is_file()]
    assert {path.suffix for path in files} >= {".json", ".safetensors", ".html"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 & ~mask, path
    for path in [run_dir, run_dir / NODES_DIR]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700 & ~mask, path


# issue 24 item tmpfiles: a SIGKILL during an atomic write left `.a.safetensors.<hex>.tmp` in the
# run directory, and nothing ever removed it
def test_a_resume_removes_the_temporaries_of_writes_a_killed_run_left(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "torn", frozenset({"a", "b"}))
    left = [run_dir / NODES_DIR / ".c.safetensors.0123456789ab.tmp", run_dir / ".record.json.ba9876543210.tmp"]
    for path in left:
        path.write_bytes(b"half a file")
    mine = run_dir / "notes.tmp"  # not a name write_atomic gives: stays
    mine.write_bytes(b"mine")
    result, _, _ = resume_run_sync(run_dir, pool=reference["pool"])
    assert result.status == "finished", result.error
    assert not any(path.exists() for path in left)
    assert mine.read_bytes() == b"mine"
    assert [path.name for path in run_dir.rglob("*.tmp")] == ["notes.tmp"]
