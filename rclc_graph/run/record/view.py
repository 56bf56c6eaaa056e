"""What a run directory says now: its record, checked, and brought up to date with its node files.

record.json is rewritten when a run starts and when it ends. A run killed in between (SIGKILL,
a power loss) leaves a record that still says "running", lists every node as unfinished and
points at a report.html that was never written, while `nodes/` holds every node that did
finish. `current_record` tells the two apart by the directory lock (a live writer holds it;
the kernel drops it when the writer dies): a "running" record nobody holds is shown as
`crashed`, with the nodes finished on disk (verified as resume verifies them) as finished,
their outputs, hops and lineage, and the rest as unfinished. Nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..directory_lock import DirectoryLock
from .format import NODES_DIR, safe_name
from .reader import finished_nodes, read_record
from .shape import check_record

CRASHED = "crashed"


def current_record(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's record for showing it (ValueError naming the fix when it cannot be read)."""
    directory = Path(run_dir)
    record = read_record(directory)
    check_record(record)
    if record["status"] == "running" and not DirectoryLock(directory).writer_alive():
        record = _crashed(record, directory)
    return record


def _crashed(record: dict[str, Any], directory: Path) -> dict[str, Any]:
    order = [node["name"] for node in record.get("plan", {}).get("nodes", [])]
    outputs = {node["name"] for node in record.get("plan", {}).get("nodes", []) if node.get("output")}
    on_disk = finished_nodes(directory)
    order = order or list(on_disk)
    nodes = dict(record.get("nodes", {}))
    for name in order:
        if name in on_disk and name not in nodes:
            nodes[name] = {**on_disk[name].to_dict(), "file": f"{NODES_DIR}/{safe_name(name)}.json"}
    ordered = [name for name in order if name in nodes]
    return {
        **record,
        "status": CRASHED,
        "error": record.get("error") or (
            f"the process writing this run stopped before it finished (killed or crashed); "
            f"continue it with: rclc-graph resume {directory}"
        ),
        "nodes": {name: nodes[name] for name in ordered},
        "outputs": {name: nodes[name].get("text") or "" for name in ordered if name in outputs},
        "hops": [hop for name in ordered for hop in nodes[name].get("hops", [])],
        "lineage": {name: nodes[name]["lineage_summary"] for name in ordered},
        "unfinished": [name for name in order if name not in nodes],
    }
