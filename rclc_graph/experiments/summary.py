"""Per-arm measures from result rows: `summary.json` and the table a person reads.

Every measure is computed over the experiment's cases for that arm (one row per case):

    accuracy            share of cases scored correct; a failed run counts as wrong (it gave
                        no answer) and `failed` says how many there were
    accuracy_ci         95% percentile bootstrap interval of accuracy (see stats.py)
    median_latency_s    median end-to-end wall time of the finished runs
    positions           mean positions kept per case, summed over the case's hops
    positions_sent      mean positions the senders held when selection ran, summed likewise
    compression         positions_sent / positions (None without hops)
    output_positions    mean positions in the answering node's state (what it read)
    payload_bytes       mean bytes handed over per case, summed over hops
    evidence_survival   mean share of the gold evidence tokens present in the answering
                        node's state (None when not measurable: no gold data, text hops)
    evidence_by_depth   the same share at each depth (hops from the gold reader)
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from rich.table import Table

from ..render.units import format_bytes as _format_bytes
from . import stats
from .arms import Arm

TABLE_WIDTH = 120
MEASURES = ("accuracy", "accuracy_ci", "median_latency_s", "positions", "payload_bytes", "evidence_survival")


def summarise_arm(
    rows: Sequence[Mapping[str, Any]],
    *,
    resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
) -> dict[str, Any]:
    """The measures of one arm from its rows (one per case)."""
    finished = [row for row in rows if row.get("status") == "finished"]
    outcomes = [bool(row.get("correct")) for row in rows]
    interval = stats.bootstrap_mean_interval(outcomes, resamples=resamples, seed=seed)
    positions = stats.mean(row.get("positions_kept") for row in finished)
    positions_sent = stats.mean(row.get("positions_sent") for row in finished)
    has_hops = [row for row in finished if row.get("hops")]
    compression = None
    if has_hops and positions:
        compression = positions_sent / positions if positions_sent is not None else None
    by_depth: dict[int, list[float]] = {}
    for row in finished:
        evidence = row.get("evidence") or {}
        tokens = evidence.get("evidence_tokens")
        if not tokens:
            continue
        for node in evidence.get("nodes", ()):
            by_depth.setdefault(int(node["depth"]), []).append(node["surviving"] / tokens)
    return {
        "cases": len(rows),
        "finished": len(finished),
        "failed": len(rows) - len(finished),
        "correct": sum(outcomes),
        "accuracy": stats.accuracy(outcomes),
        "accuracy_ci": None if interval is None else interval.to_list(),
        "median_latency_s": stats.median(row.get("latency_s") for row in finished),
        "mean_latency_s": stats.mean(row.get("latency_s") for row in finished),
        "selection_s": stats.mean(row.get("selection_s") for row in finished),
        "generation_s": stats.mean(row.get("generation_s") for row in finished),
        "positions": positions,
        "positions_sent": positions_sent,
        "compression": compression,
        "output_positions": stats.mean(row.get("output_positions") for row in finished),
        "payload_bytes": stats.mean(row.get("payload_bytes") for row in finished),
        "evidence_survival": stats.mean(row.get("evidence_at_output") for row in finished),
        "evidence_cases": sum(1 for row in finished if row.get("evidence_at_output") is not None),
        "evidence_by_depth": {str(depth): stats.mean(values) for depth, values in sorted(by_depth.items())},
        "answer_chars": stats.mean(len(row["answer"]) for row in finished if isinstance(row.get("answer"), str)),
        "model_fingerprints": sorted({f"{k}={v}" for row in finished for k, v in (row.get("model_fingerprints") or {}).items()}),
    }


def summarise(
    rows: Iterable[Mapping[str, Any]],
    arms: Sequence[Arm],
    case_ids: Sequence[str],
    *,
    resamples: int = stats.DEFAULT_RESAMPLES,
    bootstrap_seed: int = stats.DEFAULT_SEED,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json's content: `arms.NAME` -> measures, plus the run's metadata.

    Only rows of the given cases and arms count (a results file may hold more, from an
    earlier run with other arms); the latest row per (case, arm) wins.
    """
    wanted = set(case_ids)
    latest: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in rows:
        if row["case"] in wanted:
            latest[(row["case"], row["arm"])] = row
    arms_out: dict[str, Any] = {}
    missing = 0
    for arm in arms:
        arm_rows = [latest[(case, arm.name)] for case in case_ids if (case, arm.name) in latest]
        missing += len(case_ids) - len(arm_rows)
        arms_out[arm.name] = {
            "mode": arm.mode,
            "label": arm.label,
            "arm": arm.describe(),
            **summarise_arm(arm_rows, resamples=resamples, seed=bootstrap_seed),
        }
    return {
        "arms": arms_out,
        "cases": len(case_ids),
        "missing_rows": missing,
        "bootstrap": {"resamples": resamples, "confidence": stats.DEFAULT_CONFIDENCE, "seed": bootstrap_seed},
        **dict(metadata or {}),
    }


def table(summary: Mapping[str, Any], *, title: str | None = None) -> Table:
    """A rich Table: one line per arm. Cells never wrap; print it on a console at least
    `TABLE_WIDTH` wide (the CLI does) so nothing is cut."""
    result = Table(title=title or f"{summary.get('cases', '?')} cases", title_justify="left")
    for header, justify in (
        ("arm", "left"), ("mode", "left"), ("n", "right"), ("accuracy", "right"), ("95% CI", "right"),
        ("p50 latency", "right"), ("kept", "right"), ("compr.", "right"), ("payload", "right"), ("evidence", "right"),
        ("failed", "right"),
    ):
        result.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for name, arm in summary["arms"].items():
        interval = arm["accuracy_ci"]
        result.add_row(
            name,
            arm["label"],
            str(arm["cases"]),
            _format(arm["accuracy"], "{:.1%}"),
            "-" if not interval else f"{interval[0]:.0%}-{interval[1]:.0%}",
            _format(arm["median_latency_s"], "{:.2f} s"),
            _format(arm["positions"], "{:.0f}"),
            _format(arm["compression"], "{:.1f}x"),
            format_bytes(arm["payload_bytes"]),
            _format(arm["evidence_survival"], "{:.0%}"),
            str(arm["failed"]),
        )
    return result


def format_accuracy(value: float | None, interval: Sequence[float] | None) -> str:
    if value is None:
        return "-"
    if not interval:
        return f"{value:.1%}"
    return f"{value:.1%} [{interval[0]:.1%}, {interval[1]:.1%}]"


def format_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    return _format_bytes(value)


def _format(value: float | None, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return pattern.format(value)
