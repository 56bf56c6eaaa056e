"""The last resume or answer of a run that failed before the run could record it:
`<runs>/.serve/attempts/<run_id>.json`.

A resume is admitted (202) once its checks pass, then runs in the background. When it fails
before the resumed run writes anything (a model that cannot load, a module that cannot be
imported, a record file that cannot be written), the run directory still says what it said
before, and the reason lived only in the server's log: the run looked `interrupted` with no
error, the client had no way to learn why. The reason is kept here instead, shown by
`GET /runs/{id}` and the list as the run's `error`, and dropped once a later attempt starts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rclc.files import write_json_atomic

from ..spec import bounded_json


class FailedAttempts:
    """The failed-attempt files of one runs directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.json"

    def record(self, run_id: str, kind: str, error: str) -> None:
        """Keep why a `kind` (resume | answer) attempt of `run_id` failed."""
        write_json_atomic(self._path(run_id), {"run_id": run_id, "kind": kind, "error": error, "at": time.time()})

    def clear(self, run_id: str) -> None:
        """A later attempt started: the earlier failure no longer describes the run."""
        self._path(run_id).unlink(missing_ok=True)

    def read(self, run_id: str) -> dict[str, Any] | None:
        """The failed attempt of `run_id`, or None (none, or a damaged file)."""
        try:
            data = bounded_json.loads(self._path(run_id).read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("error"), str) else None
