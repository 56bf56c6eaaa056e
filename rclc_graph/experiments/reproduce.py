"""Checking that a rerun reproduced an experiment: same graphs, same models, same answers.

Every result row records what an exact rerun depends on: the arm's graph (`arm_fingerprint`,
which covers prompts, agents, sampling settings and policies), the case (`case_fingerprint`),
the models' fingerprints, the run seed and whether every agent decoded greedily. Two rows of
the same (case, arm) are comparable when all of those agree; with greedy decoding their
answers must then be identical, and any difference is a reproducibility bug.

The comparison also tests, arm by arm, whether the two runs are right on the same cases:
McNemar's exact paired test over the cases both directories hold for that arm (stats.py).
Rows scored by different scorers are left out of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .stats import PairedComparison, paired_comparison
from .store import read_rows
from ..errors import UsageError

_SAME = ("arm_fingerprint", "case_fingerprint", "model_fingerprints", "seed")


@dataclass(frozen=True)
class Reproduction:
    compared: int
    identical: int
    differing: tuple[dict[str, Any], ...]  # {case, arm, first, second}
    not_comparable: tuple[dict[str, Any], ...]  # {case, arm, reason}
    paired: Mapping[str, PairedComparison] = field(default_factory=dict)  # arm -> first directory vs second

    @property
    def reproduced(self) -> bool:
        return self.compared > 0 and not self.differing

    def to_dict(self) -> dict[str, Any]:
        return {
            "reproduced": self.reproduced,
            "compared": self.compared,
            "identical": self.identical,
            "differing": list(self.differing),
            "not_comparable": list(self.not_comparable),
            "paired": {arm: pair.to_dict() for arm, pair in self.paired.items()},
        }


def compare_rows(first: Mapping[str, Any], second: Mapping[str, Any]) -> str | None:
    """None when the two rows must have equal answers, else why they need not."""
    for row, which in ((first, "first"), (second, "second")):
        if row.get("status") != "finished":
            return f"{which} run did not finish"
        if row.get("greedy") is not True:
            return f"{which} run did not decode greedily (or did not record it)"
    for key in _SAME:
        if first.get(key) != second.get(key):
            return f"{key} differs"
    if not first.get("model_fingerprints"):
        return "no model fingerprints recorded"
    return None


def compare_runs(first_dir: str | os.PathLike[str], second_dir: str | os.PathLike[str]) -> Reproduction:
    """Compare the latest row of every (case, arm) found in both directories (ValueError when
    they are one directory: a run compared with itself proves nothing)."""
    if Path(first_dir).resolve() == Path(second_dir).resolve():
        raise UsageError(
            f"compare-runs: {os.fspath(first_dir)!r} and {os.fspath(second_dir)!r} are the same directory; "
            "pass the directory of a rerun (the same command with another --out)"
        )
    first = {(row["case"], row["arm"]): row for row in read_rows(first_dir)}
    second = {(row["case"], row["arm"]): row for row in read_rows(second_dir)}
    differing, not_comparable = [], []
    compared = identical = 0
    for key in sorted(first.keys() & second.keys()):
        reason = compare_rows(first[key], second[key])
        if reason is not None:
            not_comparable.append({"case": key[0], "arm": key[1], "reason": reason})
            continue
        compared += 1
        if first[key].get("answer") == second[key].get("answer"):
            identical += 1
        else:
            differing.append({"case": key[0], "arm": key[1], "first": first[key].get("answer"), "second": second[key].get("answer")})
    return Reproduction(compared, identical, tuple(differing), tuple(not_comparable), _paired(first, second))


def _paired(first: Mapping[tuple[str, str], Mapping[str, Any]],
            second: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, PairedComparison]:
    """Per arm, McNemar's exact test of the first directory's outcomes against the second's."""
    by_arm: dict[str, list[tuple[bool, bool]]] = {}
    for key in sorted(first.keys() & second.keys()):
        a, b = first[key], second[key]
        if a.get("scorer") != b.get("scorer"):
            continue
        by_arm.setdefault(key[1], []).append((bool(a.get("correct")), bool(b.get("correct"))))
    return {arm: paired_comparison("first", "second", pairs) for arm, pairs in sorted(by_arm.items())}
