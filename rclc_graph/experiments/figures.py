"""Plots and `report.md` from a summary (matplotlib with the Agg backend: no display needed).

    accuracy_vs_compression.png  accuracy (with its 95% interval) against compression
                                 (positions sent / kept, log scale) for arms with handoffs;
                                 the reference arms (question_only, single_context) and arms
                                 without a measurable compression are horizontal lines
    accuracy_vs_latency.png      accuracy against median end-to-end latency, every arm
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

from rclc.files import write_atomic

from .summary import format_accuracy, format_bytes, format_p, format_versus

COMPRESSION_PLOT = "accuracy_vs_compression.png"
LATENCY_PLOT = "accuracy_vs_latency.png"
REPORT = "report.md"


def _pyplot() -> Any:
    import matplotlib  # lazy: matplotlib is heavy, and only experiments that finish plot

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot


def _error_bar(arm: Mapping[str, Any]) -> list[list[float]]:
    low, high = arm["accuracy_ci"] or [arm["accuracy"], arm["accuracy"]]
    return [[max(arm["accuracy"] - low, 0.0)], [max(high - arm["accuracy"], 0.0)]]


@contextlib.contextmanager
def _accuracy_figure(summary: Mapping[str, Any], path: str | os.PathLike[str], what: str, x_label: str) -> Iterator[Any]:
    """Axes whose y axis is accuracy; the block draws the arms, then the figure is labelled,
    written to `path` (atomically) and closed."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    try:
        yield axes
        axes.set_xlabel(x_label)
        axes.set_ylabel("accuracy (95% Wilson interval)")
        axes.set_ylim(-0.02, 1.02)
        axes.set_title(_title(summary, what))
        axes.grid(True, alpha=0.3)
        figure.tight_layout()
        image = io.BytesIO()
        figure.savefig(image, dpi=120, format="png")
        write_atomic(path, image.getvalue())
    finally:
        pyplot.close(figure)


def _point(axes: Any, x: float, arm: Mapping[str, Any], name: str, colour: str) -> None:
    """One arm as a point with its accuracy interval, labelled with its name."""
    axes.errorbar([x], [arm["accuracy"]], yerr=_error_bar(arm), fmt="o", capsize=3, color=colour, label=name)
    axes.annotate(name, (x, arm["accuracy"]), textcoords="offset points", xytext=(5, 5), fontsize=8)


def plot_accuracy_vs_compression(summary: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Accuracy against compression for arms with handoffs; reference arms as horizontal lines."""
    with _accuracy_figure(summary, path, "accuracy vs compression",
                          "compression: positions sent / positions kept (log scale)") as axes:
        points = lines = 0
        for index, (name, arm) in enumerate(summary["arms"].items()):
            if arm["accuracy"] is None:
                continue
            colour = f"C{index % 10}"
            if arm["compression"] is not None and arm["compression"] > 0:
                _point(axes, arm["compression"], arm, name, colour)
                points += 1
            else:
                axes.axhline(arm["accuracy"], linestyle="--", linewidth=1, color=colour, label=f"{name} ({arm['label']})")
                lines += 1
        if points:
            axes.set_xscale("log", base=2)
        if points or lines:
            axes.legend(fontsize=8, loc="best")
    return Path(path)


def plot_accuracy_vs_latency(summary: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Accuracy against median end-to-end latency, every arm."""
    with _accuracy_figure(summary, path, "accuracy vs latency", "median end-to-end latency (s)") as axes:
        plotted = 0
        for index, (name, arm) in enumerate(summary["arms"].items()):
            if arm["accuracy"] is None or arm["median_latency_s"] is None:
                continue
            plotted += 1
            _point(axes, arm["median_latency_s"], arm, name, f"C{index % 10}")
        if plotted:
            axes.legend(fontsize=8, loc="best")
    return Path(path)


def markdown_table(summary: Mapping[str, Any]) -> str:
    reference = (summary.get("paired") or {}).get("reference")
    lines = [
        "| arm | mode | n | accuracy [95% CI] | "
        + (f"vs {reference} (McNemar) | " if reference else "")
        + "median latency (s) | positions kept | compression | payload | evidence kept | failed |",
        "| --- | --- | ---: | ---: | " + ("---: | " if reference else "") + "---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, arm in summary["arms"].items():
        lines.append(
            f"| {name} | {arm['label']} | {arm['cases']} | {format_accuracy(arm['accuracy'], arm['accuracy_ci'])} | "
            + (f"{format_versus(summary, name)} | " if reference else "")
            + f"{_num(arm['median_latency_s'], '{:.2f}')} | {_num(arm['positions'], '{:.0f}')} | "
            f"{_num(arm['compression'], '{:.1f}x')} | {format_bytes(arm['payload_bytes'])} | "
            f"{_num(arm['evidence_survival'], '{:.0%}')} | {arm['failed']} |"
        )
    return "\n".join(lines)


def paired_table(summary: Mapping[str, Any]) -> str:
    """Every pair of arms: the 2x2 counts on their shared cases and McNemar's exact p."""
    pairs = (summary.get("paired") or {}).get("pairs") or []
    if not pairs:
        return "Only one arm: no paired tests."
    lines = [
        "| arm A | arm B | cases | both right | only A | only B | both wrong | p (exact McNemar) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for pair in pairs:
        lines.append(
            f"| {pair['first']} | {pair['second']} | {pair['cases']} | {pair['both_correct']} | {pair['only_first']} | "
            f"{pair['only_second']} | {pair['both_wrong']} | {format_p(pair['p_value'])} |"
        )
    return "\n".join(lines)


def write_report(summary: Mapping[str, Any], directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Write both plots and report.md into `directory`; returns their paths."""
    directory = Path(directory)
    paths = {
        "compression_plot": plot_accuracy_vs_compression(summary, directory / COMPRESSION_PLOT),
        "latency_plot": plot_accuracy_vs_latency(summary, directory / LATENCY_PLOT),
    }
    topology = summary.get("topology", {})
    dataset = summary.get("dataset", {})
    arms = "\n".join(f"- `{name}`: `{json.dumps(arm['arm'].get('policy', arm['arm']['kind']))}`"
                     for name, arm in summary["arms"].items())
    text = f"""# Experiment: {topology.get('name', '?')}

Topology `{topology.get('path', '?')}` over {summary.get('cases', '?')} cases of `{dataset.get('path', '?')}`
(sha256 `{str(dataset.get('sha256', '?'))[:16]}...`). Scorer: `{summary.get('scorer', '?')}`.

{markdown_table(summary)}

Accuracy intervals: 95% Wilson score intervals. "vs" compares each arm with the reference arm on
the cases both ran: McNemar's exact two-sided p, then (+cases only this arm got right/-cases only
the reference got right). A failed run counts as wrong. Median latency leaves out warm-up runs
(those that loaded a model, and the first run of each process). Positions and payload are per
case, summed over hops. "Evidence kept" is the mean share of the gold evidence tokens present in
the answering node's state ("-" when not measurable, e.g. over text hops).

## Paired tests

{paired_table(summary)}

![accuracy vs compression]({COMPRESSION_PLOT})

![accuracy vs latency]({LATENCY_PLOT})

## Arms

{arms}

## Reproducing

Seeds: `{json.dumps(summary.get('seeds', {}))}`; greedy decoding: `{summary.get('greedy')}`.
Model fingerprints: `{json.dumps(summary.get('model_fingerprints', {}))}`.
Versions: `{json.dumps(summary.get('versions', {}))}`.

Rerun the same command into another directory and compare the answers with
`rclc-graph compare-runs {directory} OTHER_DIR`: with greedy decoding, the same model
fingerprints and the same graphs, every answer must match.
"""
    paths["report"] = directory / REPORT
    write_atomic(paths["report"], text.encode("utf-8"))
    return paths


def _title(summary: Mapping[str, Any], what: str) -> str:
    name = summary.get("topology", {}).get("name")
    return f"{name}: {what} ({summary.get('cases', '?')} cases)" if name else what


def _num(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)
