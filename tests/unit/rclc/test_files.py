"""rclc.files: the one atomic write (snapshots, run records, reports, experiment rows and plots)."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from rclc.files import file_sha256, sync_directory, write_atomic, write_json_atomic


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_write_atomic_replaces_creates_parents_and_leaves_no_temporaries(tmp_path):
    target = tmp_path / "sub" / "deeper" / "file.bin"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(os.listdir(target.parent)) == ["file.bin"]
    # issue 16 item 19: one rule for every file written, private to the owner (was 0o666 less the umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 & ~_umask()
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700 & ~_umask()


def test_write_atomic_mode_keeps_private_files_private(tmp_path):
    target = tmp_path / "private.bin"
    write_atomic(target, b"secret", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 & ~_umask()


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch, failing):
    target = tmp_path / "file.bin"
    write_atomic(target, b"old")

    def fail(*args):
        raise OSError(f"{failing} failed")

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(OSError, match=f"{failing} failed"):
        write_atomic(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["file.bin"]


def test_write_json_is_strict_and_atomic(tmp_path):
    target = tmp_path / "r.json"
    record = {"name": "Åsa", "n": [1, 2]}
    write_json_atomic(target, record)
    assert target.read_text(encoding="utf-8") == json.dumps(record, indent=1, ensure_ascii=False) + "\n"
    with pytest.raises(ValueError):
        write_json_atomic(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"name": "Åsa", "n": [1, 2]}
    assert sorted(os.listdir(tmp_path)) == ["r.json"]
    write_json_atomic(target, record, indent=2)  # e.g. an experiment's summary.json
    assert target.read_text(encoding="utf-8") == json.dumps(record, indent=2, ensure_ascii=False) + "\n"


def test_file_sha256_and_sync_directory(tmp_path):
    target = tmp_path / "big.bin"
    data = os.urandom(3 * (1 << 20) + 5)  # spans several read blocks
    target.write_bytes(data)
    assert file_sha256(target) == hashlib.sha256(data).hexdigest()
    sync_directory(tmp_path)
    sync_directory(tmp_path / "missing")  # best effort: nothing to sync is not an error


def _killed_write(destination, monkeypatch):
    """What a write killed between creating its temporary and renaming it leaves: the temporary."""
    from rclc import files

    left = []

    def die(source, target):
        left.append(source)
        raise KeyboardInterrupt  # stands for the kill: nothing after this point runs

    monkeypatch.setattr(files.os, "replace", die)
    monkeypatch.setattr(files.os, "remove", lambda path: None)  # a killed process removes nothing
    with pytest.raises(KeyboardInterrupt):
        write_atomic(destination, b"torn")
    monkeypatch.undo()
    return left[0]


# issue 24 item tmpfiles
def test_interrupted_writes_leave_only_their_own_temporaries_which_are_removed_later(tmp_path, monkeypatch):
    from rclc.files import remove_interrupted_writes

    (tmp_path / "nodes").mkdir()
    left = [_killed_write(tmp_path / "nodes" / "a.safetensors", monkeypatch),
            _killed_write(tmp_path / "record.json", monkeypatch)]
    assert all(os.path.exists(path) for path in left)
    # look-alikes that write_atomic never writes stay, as do other writers' subdirectories
    keep = [tmp_path / "notes.tmp", tmp_path / ".a.safetensors.xyz.tmp", tmp_path / ".b.0123456789ab.tmp.bak"]
    for path in keep:
        path.write_bytes(b"user data")
    (tmp_path / "other").mkdir()
    theirs = _killed_write(tmp_path / "other" / "x.json", monkeypatch)
    removed = remove_interrupted_writes(tmp_path, skip=lambda directory: directory.name == "other")
    assert sorted(map(str, removed)) == sorted(map(str, left))
    assert not any(os.path.exists(path) for path in left)
    assert all(path.read_bytes() == b"user data" for path in keep)
    assert os.path.exists(theirs)
