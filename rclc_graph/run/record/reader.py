"""Reading a run directory back: its record, its node files, and which nodes finished on disk
(the format is in format.py). Everything read is checked: links, FIFOs and damaged JSON are
refused with an error that names the file and the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rclc.files import file_sha256

from ...errors import UsageError
from ...results.run_result import NodeResult
from ..run_files import member, read_json, regular
from .format import NODE_FORMAT, NODES_DIR, RECORD_FILE, RECORD_FORMAT, RECORD_VERSION, safe_name


def read_record(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The record of a run directory, checked to be one (ValueError naming the fix otherwise)."""
    directory = Path(run_dir)
    path = directory / RECORD_FILE
    if not directory.is_dir():
        raise UsageError(f"run_dir: {str(directory)!r} is not a directory; pass a runs/<run_id> directory")
    if not path.is_file() and not path.is_symlink():
        raise UsageError(
            f"run_dir: {str(directory)!r} holds no {RECORD_FILE}; pass a directory written by `rclc-graph run`"
        )
    try:
        record = read_json(path, "run_dir")
    except json.JSONDecodeError as error:
        raise UsageError(f"run_dir: {str(path)!r} is not valid JSON ({error}); the record is damaged") from None
    except ValueError as error:
        raise UsageError(f"run_dir: {str(path)!r} cannot be read ({error}); the record is damaged") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise UsageError(f"run_dir: {str(path)!r} is not an rclc-graph run record")
    if record.get("version") != RECORD_VERSION:
        raise UsageError(
            f"run_dir: record version {record.get('version')!r}; this rclc-graph reads version {RECORD_VERSION} only"
        )
    return record


def read_node(path: str | os.PathLike[str]) -> tuple[NodeResult, dict[str, Any] | None]:
    """A node file: (its NodeResult, its snapshot info or None). ValueError (or KeyError,
    TypeError for wrongly typed fields) when it is not one; links and FIFOs are refused."""
    data = read_json(Path(path), "path")
    if not isinstance(data, dict) or data.get("format") != NODE_FORMAT:
        raise UsageError(f"path: {os.fspath(path)!r} is not an rclc-graph node record")
    if data.get("version") != RECORD_VERSION:
        raise UsageError(f"path: node record version {data.get('version')!r}; expected {RECORD_VERSION}")
    return NodeResult.from_dict(data), data.get("snapshot")


def finished_nodes(run_dir: str | os.PathLike[str]) -> dict[str, NodeResult]:
    """Nodes finished on disk: node JSON present, snapshot present, and the snapshot's
    SHA-256 equal to the one the JSON names. Anything else (missing, torn by a crash,
    replaced) is left out, so a resume runs that node again."""
    directory = Path(run_dir) / NODES_DIR
    finished: dict[str, NodeResult] = {}
    if not directory.is_dir() or directory.is_symlink():
        return finished
    for path in sorted(directory.glob("*.json")):
        try:
            result, snapshot = read_node(path)
            if path.stem != safe_name(result.node):
                continue
            if snapshot is None and result.kind == "function":  # a function keeps no state: no snapshot
                finished[result.node] = result
                continue
            if not isinstance(snapshot, dict):
                continue
            snapshot_path = member(directory, snapshot.get("file"), f"{path.stem}.safetensors")
            regular(snapshot_path, "snapshot")
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if file_sha256(snapshot_path) != snapshot.get("sha256"):
            continue
        finished[result.node] = result
    return finished
