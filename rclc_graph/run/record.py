"""Run directories: what a run read, produced and kept, written so a crash never leaves a torn file.

Layout of `runs/<run_id>/`:

    record.json               the run as a whole (status, inputs, outputs, hops, lineage,
                              versions, seeds, model and plan fingerprints, the topology)
    report.html               a self-contained page of the same (render/html_report.py)
    nodes/<safe>.json         one finished node: NodeResult.to_dict() plus its snapshot's identity
    nodes/<safe>.safetensors  that node's agent state (rclc snapshot: tensors + metadata only)
    .lock                     empty; locked while a process writes the directory (directory_lock.DirectoryLock)

Every file is written to a temporary name in the same directory, flushed, fsynced and renamed
over its destination (then the directory is fsynced), so a reader sees the old file or the
new one, never half of one. Nothing executable is stored: JSON and safetensors only
(and the empty lock file).

This module is the format: names, versions, identities and the readers. recorder.py writes a
directory while a run goes; recorded.py runs a plan with a recorder.

Node files are written as each node finishes, before any node that reads from it starts
(the recording executor saves inside `run_node`), which is what crash-resume relies on. A
node counts as finished on disk only when its JSON exists, its snapshot exists, and the
snapshot's SHA-256 matches the one the JSON names (`finished_nodes`); a function node
keeps no state, so its JSON alone (kind "function", no snapshot) says it finished. The snapshot is
written first and the JSON second, so a crash between them leaves a node that is simply
not finished.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import rclc
from rclc.files import file_sha256

from ..results.run_result import NodeResult
from ..spec.bounded_json import loads
from .run_files import member, read_json, regular
from ..errors import UsageError

RECORD_FORMAT = "rclc-graph-run"
RECORD_VERSION = 1
NODE_FORMAT = "rclc-graph-node"
RECORD_FILE = "record.json"
REPORT_FILE = "report.html"
NODES_DIR = "nodes"
_PLAN_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)(?:\[([0-9]+)\])?(?:@([0-9]+))?$")
_PACKAGE = Path(__file__).resolve().parents[1]  # rclc_graph/


# -- names, versions, identities ---------------------------------------------------------------


def safe_name(node: str) -> str:
    """A file-name stem for a plan node name, injective and free of shell-special characters.

    `reader` -> `reader`, `worker[2]` -> `worker.2`, `a@3` -> `a.r3`, `worker[2]@3` ->
    `worker.2.r3`. Declared names never contain '.', so the encoded parts cannot collide
    with a plain name. Anything else (not a plan name) is hex-encoded after `.x`.
    """
    match = _PLAN_NAME.match(node)
    if match is None:
        return ".x" + node.encode("utf-8").hex()
    base, index, round_ = match.groups()
    return base + ("" if index is None else f".{index}") + ("" if round_ is None else f".r{round_}")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions that decide what a run computes (read from package metadata, no imports)."""
    return {
        "rclc": rclc.__version__,
        "rclc_graph": _version("rclc-graph"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 of the source of rclc and rclc_graph (every .py file but the experiments tool).

    Package versions do not move when code is edited in place (a checkout, a patch), yet
    any edit may change what a node computes; a resume compares this to refuse finishing a
    run with different code than started it.
    """
    digest = hashlib.sha256()
    for package in (Path(rclc.__file__).parent, _PACKAGE):
        for path in sorted(package.rglob("*.py")):
            relative = path.relative_to(package.parent).as_posix()
            if "/experiments/" in relative or "__pycache__" in relative:
                continue
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def snapshot_identity(path: Path) -> dict[str, Any]:
    """What a node JSON says about its snapshot: file name, SHA-256, size and the model
    identity stored in the snapshot's own header."""
    import safetensors  # lazy: reading a header with framework="pt" imports torch

    with safetensors.safe_open(os.fspath(path), framework="pt") as reader:
        raw = (reader.metadata() or {}).get("rclc", "{}")
        header = loads(raw) if len(raw) <= 4096 else {}  # ours is ~200 bytes; never parse a huge one
        positions = int(reader.get_slice("rows").get_shape()[0])
    if not isinstance(header, dict):
        header = {}
    return {
        "file": path.name,
        "sha256": file_sha256(path),
        "bytes": path.stat().st_size,
        "positions": positions,
        "model_identity": header.get("identity"),
        "inherited_positions": header.get("inherited_positions"),
    }



# -- reading -----------------------------------------------------------------------------------


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
