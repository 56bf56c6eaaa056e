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

This module is the format: names, versions and identities. reader.py reads a directory back,
writer.py writes one while a run goes, recording.py runs a plan with a writer, shape.py checks
a record's fields, view.py says what a directory holds now (a crashed run included).

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
import os
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import rclc
from rclc.files import file_sha256

from ...spec.bounded_json import loads

RECORD_FORMAT = "rclc-graph-run"
RECORD_VERSION = 1
NODE_FORMAT = "rclc-graph-node"
RECORD_FILE = "record.json"
REPORT_FILE = "report.html"
NODES_DIR = "nodes"
_PLAN_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)(?:\[([0-9]+)\])?(?:@([0-9]+))?$")
_PACKAGE = Path(__file__).resolve().parents[2]  # rclc_graph/


# -- names, versions, identities ---------------------------------------------------------------


def safe_name(node: str) -> str:
    """A file-name stem for a plan node name, injective and free of shell-special characters.

    `reader` -> `reader`, `worker[2]` -> `worker.2`, `a@3` -> `a.r3`, `worker[2]@3` ->
    `worker.2.r3`; a subgraph's node `research[1]/reader@2` -> `research.1..reader.r2` (each
    part encoded, joined by `..`). Declared names never contain '.', and an encoded part never
    holds `..`, so the encoded parts cannot collide with a plain name or split two ways.
    Anything else (not a plan name) is hex-encoded after `.x`.
    """
    parts = node.split("/")
    matches = [_PLAN_NAME.match(part) for part in parts]
    if any(match is None for match in matches):
        return ".x" + node.encode("utf-8").hex()
    encoded = []
    for match in matches:
        base, index, round_ = match.groups()  # type: ignore[union-attr]
        encoded.append(base + ("" if index is None else f".{index}") + ("" if round_ is None else f".r{round_}"))
    return "..".join(encoded)


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
