"""Per-arm measures from result rows: `summary.json` and the table a person reads.

Every measure is computed over the experiment's cases for that arm (one row per case):

    accuracy            share of cases scored correct; a failed run counts as wrong (it gave
                        no answer) and `failed` says how many there were
    accuracy_ci         95% Wilson score interval of accuracy (see stats.py)
    median_latency_s    median end-to-end wall time of the finished runs, warm-up runs
                        excluded (a row is `warmup` when it loaded a model or was the
                        first run of its process); `latency_runs` says how many counted
    positions           mean positions kept per case, summed over the case's hops
    positions_sent      mean positions the senders held when selection ran, summed likewise
    compression         positions_sent / positions (None without hops)
    output_positions    mean positions in the answering node's state (what it read)
    payload_bytes       mean bytes handed over per case, summed over hops
    evidence_survival   mean share of the gold evidence tokens present in the answering
                        node's state (None when not measurable: no gold data, text hops)
    evidence_by_depth   the same share at each depth (hops from the gold reader)

Arms run on the same cases are also compared pairwise (`paired` in summary.json): for every
pair of arms, the 2x2 counts of who was right on each shared case and McNemar's exact
two-sided p-value (stats.py). The table shows each arm against one reference arm (the first,
unless the caller names another).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from rich.table import Table

from ..render.terminal_text import printable_line
from ..render.units import format_bytes as _format_bytes
from . import stats
from .arms import Arm
from ..errors import UsageError

TABLE_WIDTH = 140
MEASURES = ("accuracy", "accuracy_ci", "median_latency_s", "positions", "payload_bytes", "evidence_survival")


def summarise_arm(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The measures of one arm from its rows (one per case)."""
    finished = [row for row in rows if row.get("status") == "finished"]

    def mean_of(key: str) -> float | None:
        """The mean of a row field over the finished rows that have it."""
        return stats.mean(row.get(key) for row in finished)

    outcomes = [bool(row.get("correct")) for row in rows]
    interval = stats.accuracy_interval(outcomes)
    latency, latency_runs, with_warmup = stats.median_excluding(
        [(row.get("latency_s"), bool(row.get("warmup"))) for row in finished]
    )
    positions, positions_sent = mean_of("positions_kept"), mean_of("positions_sent")
    has_hops = [row for row in finished if row.get("hops")]
    compression = None
    if has_hops and positions:
        compression = positions_sent / positions if positions_sent is not None else None
    return {
        "cases": len(rows),
        "finished": len(finished),
        "failed": len(rows) - len(finished),
        "correct": sum(outcomes),
        "accuracy": stats.accuracy(outcomes),
        "accuracy_ci": None if interval is None else interval.to_list(),
        "median_latency_s": latency,
        "latency_runs": latency_runs,
        "latency_includes_warmup": with_warmup,
        "mean_latency_s": mean_of("latency_s"),
        "selection_s": mean_of("selection_s"),
        "generation_s": mean_of("generation_s"),
        "positions": positions,
        "positions_sent": positions_sent,
        "compression": compression,
        "output_positions": mean_of("output_positions"),
        "payload_bytes": mean_of("payload_bytes"),
        "evidence_survival": mean_of("evidence_at_output"),
        "evidence_cases": sum(1 for row in finished if row.get("evidence_at_output") is not None),
        "evidence_by_depth": _evidence_by_depth(finished),
        "answer_chars": stats.mean(len(row["answer"]) for row in finished if isinstance(row.get("answer"), str)),
        "model_fingerprints": sorted({f"{k}={v}" for row in finished for k, v in (row.get("model_fingerprints") or {}).items()}),
    }


def _evidence_by_depth(finished: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """How much of each case's evidence survives at each hop depth, averaged over cases."""
    by_depth: dict[int, list[float]] = {}
    for row in finished:
        evidence = row.get("evidence") or {}
        tokens = evidence.get("evidence_tokens")
        if not tokens:
            continue
        for node in evidence.get("nodes", ()):
            by_depth.setdefault(int(node["depth"]), []).append(node["surviving"] / tokens)
    return {str(depth): stats.mean(values) for depth, values in sorted(by_depth.items())}


def summarise(
    rows: Iterable[Mapping[str, Any]],
    arms: Sequence[Arm],
    case_ids: Sequence[str],
    *,
    reference: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json's content: `arms.NAME` -> measures, `paired` tests, the run's metadata.

    Only rows of the given cases and arms count (a results file may hold more, from an
    earlier run with other arms); the latest row per (case, arm) wins. `reference` names the
    arm the table compares every other arm with (default: the first).
    """
    names = [arm.name for arm in arms]
    if reference is None and names:
        reference = names[0]
    if reference is not None and reference not in names:
        raise UsageError(f"compare_to: no arm named {reference!r}; the arms are {', '.join(names)}")
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
            **summarise_arm(arm_rows),
        }
    return {
        "arms": arms_out,
        "cases": len(case_ids),
        "missing_rows": missing,
        "intervals": {"method": "wilson", "confidence": stats.DEFAULT_CONFIDENCE},
        "paired": {
            "test": "mcnemar_exact_two_sided",
            "reference": reference,
            "pairs": paired_tests(latest, names, case_ids),
        },
        **dict(metadata or {}),
    }


def paired_tests(
    latest: Mapping[tuple[str, str], Mapping[str, Any]], arms: Sequence[str], case_ids: Sequence[str]
) -> list[dict[str, Any]]:
    """McNemar's exact test for every pair of arms (in arm order), over the cases both ran.

    A failed run counts as wrong, as in accuracy."""
    pairs = []
    for index, first in enumerate(arms):
        for second in arms[index + 1:]:
            shared = [case for case in case_ids if (case, first) in latest and (case, second) in latest]
            outcomes = [(bool(latest[(case, first)].get("correct")), bool(latest[(case, second)].get("correct")))
                        for case in shared]
            pairs.append(stats.paired_comparison(first, second, outcomes).to_dict())
    return pairs


def versus(summary: Mapping[str, Any], arm: str, reference: str) -> dict[str, Any] | None:
    """The paired test of `arm` against `reference`, oriented so `only_arm` counts the cases
    only `arm` got right; None when the summary has no such pair."""
    for pair in (summary.get("paired") or {}).get("pairs", ()):
        if {pair["first"], pair["second"]} == {arm, reference} and arm != reference:
            forward = pair["first"] == arm
            return {
                "cases": pair["cases"],
                "only_arm": pair["only_first"] if forward else pair["only_second"],
                "only_reference": pair["only_second"] if forward else pair["only_first"],
                "p_value": pair["p_value"],
            }
    return None


def format_versus(summary: Mapping[str, Any], arm: str) -> str:
    """The table cell for `arm` against the summary's reference arm: "p=0.031 (+6/-1)"
    (cases only this arm got right / only the reference got right), "ref" for the reference."""
    reference = (summary.get("paired") or {}).get("reference")
    if reference is None:
        return "-"
    if arm == reference:
        return "ref"
    test = versus(summary, arm, reference)
    if test is None or test["cases"] == 0:
        return "-"
    return f"p={format_p(test['p_value'])} (+{test['only_arm']}/-{test['only_reference']})"


def format_p(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def table(summary: Mapping[str, Any], *, title: str | None = None) -> Table:
    """A rich Table: one line per arm. Cells never wrap; print it on a console at least
    `TABLE_WIDTH` wide (the CLI does) so nothing is cut."""
    result = Table(title=title or f"{summary.get('cases', '?')} cases", title_justify="left")
    reference = (summary.get("paired") or {}).get("reference")
    for header, justify in (
        ("arm", "left"), ("mode", "left"), ("n", "right"), ("accuracy", "right"), ("95% CI", "right"),
        (f"vs {reference}" if reference else "paired", "right"),
        ("p50 latency", "right"), ("kept", "right"), ("compr.", "right"), ("payload", "right"), ("evidence", "right"),
        ("failed", "right"),
    ):
        result.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for name, arm in summary["arms"].items():
        interval = arm["accuracy_ci"]
        result.add_row(
            printable_line(name),
            printable_line(arm["label"]),
            str(arm["cases"]),
            _format(arm["accuracy"], "{:.1%}"),
            "-" if not interval else f"{interval[0]:.0%}-{interval[1]:.0%}",
            format_versus(summary, name),
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
