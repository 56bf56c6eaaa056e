"""Runs the server admitted but has not started: each waits in
`<runs>/.serve/submissions/<run_id>.json` until its run has a directory.

A run's directory (written by `run_recorded`) appears with its first event; until then this
file is all that says the run exists, so a server killed while runs were queued finds them
here at its next start and queues them again. A submission that never started keeps its
file with the status it ended in (cancelled, or failed with the reason), so GET /runs still
lists it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rclc.files import write_json_atomic

from ..errors import GraphError
from ..plan.compile import compile_plan
from ..plan.dag import Plan
from ..spec.bounded_json import plain
from ..spec import bounded_json
from ..spec.models import GraphSpec

logger = logging.getLogger(__name__)


@dataclass
class Submission:
    """A run the server accepted: a new run (a plan), or a resume of a run directory."""

    run_id: str
    kind: str  # new | resume | answer
    submitted_at: float = field(default_factory=time.time)
    plan: Plan | None = None
    topology: str | None = None  # the directory topology's name; None for an upload
    topology_file: Path | None = None
    base_dir: Path | None = None
    seed: int = 0
    answers: dict[str, str] | None = None
    preflighted: bool = False  # planned and preflighted by this process (not read back after a restart)


class SubmissionStore:
    """The submission files of one runs directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, run_id: str) -> Path:
        """Where run `run_id`'s submission is (the caller checked the id)."""
        return self.directory / f"{run_id}.json"

    def write(self, submission: Submission, status: str, error: str | None = None) -> None:
        """Save a new run's submission (its plan as the spec and inputs it was compiled from)."""
        plan = submission.plan
        assert plan is not None
        write_json_atomic(self.path(submission.run_id), {
            "run_id": submission.run_id, "kind": submission.kind, "status": status, "error": error,
            "submitted_at": submission.submitted_at, "graph": plan.name, "topology": submission.topology,
            "topology_file": None if submission.topology_file is None else str(submission.topology_file),
            "base_dir": None if submission.base_dir is None else str(submission.base_dir),
            "spec": plan.spec.model_dump(mode="json"), "inputs": plain(plan.inputs),
            "trust_code": plan.trust_code, "seed": submission.seed,
        })

    def read(self, run_id: str) -> dict[str, Any] | None:
        """Run `run_id`'s submission, or None when there is none (or it is damaged)."""
        return read_json(self.path(run_id))

    def remove(self, run_id: str) -> None:
        """Forget a submission (its run has a directory now, or it was refused)."""
        self.path(run_id).unlink(missing_ok=True)

    def run_ids(self) -> set[str]:
        """Every run with a submission file."""
        return {path.stem for path in self.directory.glob("*.json")}

    def pending(self, runs_dir: Path, *, trust_code: bool) -> list[Submission]:
        """The queued submissions an earlier server left, oldest first, planned again. One whose
        run had started (its directory has a record) is removed; one that no longer plans is
        marked failed with the reason. Code runs only where both the submission and this
        server trust it."""
        waiting = []
        for path in self.directory.glob("*.json"):
            data = read_json(path)
            if data is None or data.get("status") != "queued":
                continue
            if (runs_dir / path.stem / "record.json").is_file():  # it had started: the directory has it
                path.unlink(missing_ok=True)
                continue
            waiting.append(data)
        submissions = []
        for data in sorted(waiting, key=lambda item: item.get("submitted_at") or 0):
            try:
                plan = compile_plan(GraphSpec.model_validate(data["spec"]), data["inputs"],
                                    trust_code=bool(data.get("trust_code")) and trust_code)
            except (GraphError, ValueError, KeyError) as error:
                logger.warning("submission %s no longer plans: %s", data.get("run_id"), error)
                write_json_atomic(self.path(str(data.get("run_id"))),
                                  {**data, "status": "failed", "error": f"it no longer plans: {error}"})
                continue
            topology_file = data.get("topology_file")
            base_dir = data.get("base_dir")
            submissions.append(Submission(
                str(data["run_id"]), "new", float(data.get("submitted_at") or time.time()), plan,
                data.get("topology"), None if topology_file is None else Path(topology_file),
                None if base_dir is None else Path(base_dir), int(data.get("seed") or 0)))
        return submissions


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing or damaged."""
    try:
        data = bounded_json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

