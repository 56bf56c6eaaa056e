"""The last resume or answer of a run that failed before the run could record it:
`<runs>/.serve/attempts/<run_id>.json`.

A resume is admitted (202) once its checks pass, then runs in the background. When it fails
before the resumed run writes anything (a model that cannot load, a module that cannot be
imported, a record file that cannot be written), the run directory still says what it said
before, and the reason lived only in the server's log: the run looked `interrupted` with no
error, the client had no way to learn why. The reason is kept here instead, shown by
`GET /runs/{id}` and the list as the run's `error`, and dropped once a later attempt starts.

It describes the run only while the run's record.json is the one it failed against (the
file's size and mtime are kept with it): a run resumed since by another process
(`rclc-graph resume` on the same directory) has a newer record, and the old failure is
no longer its error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rclc.files import write_json_atomic

from ..spec import bounded_json


class FailedAttempts:
    """The failed-attempt files of one runs directory (`runs_dir`)."""

    def __init__(self, directory: Path, runs_dir: Path) -> None:
        self.directory, self.runs_dir = directory, runs_dir

    def _path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.json"

    def _record_version(self, run_id: str) -> list[int] | None:
        try:
            stat = (self.runs_dir / run_id / "record.json").stat()
        except OSError:
            return None
        return [stat.st_mtime_ns, stat.st_size]

    def record(self, run_id: str, kind: str, error: str) -> None:
        """Keep why a `kind` (resume | answer) attempt of `run_id` failed."""
        write_json_atomic(self._path(run_id), {"run_id": run_id, "kind": kind, "error": error, "at": time.time(),
                                               "record": self._record_version(run_id)})

    def clear(self, run_id: str) -> None:
        """A later attempt started: the earlier failure no longer describes the run."""
        self._path(run_id).unlink(missing_ok=True)

    def read(self, run_id: str) -> dict[str, Any] | None:
        """The failed attempt of `run_id`, or None (none, or a damaged file)."""
        try:
            data = bounded_json.loads(self._path(run_id).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("error"), str):
            return None
        return data if data.get("record") == self._record_version(run_id) else None  # else: the run has moved on
