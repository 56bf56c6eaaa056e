"""Command-line pieces for experiments, as a typer sub-app the main `rclc-graph` app mounts:

    main_app.add_typer(rclc_graph.experiments.commands.app)    # adds `experiment`, `data`, `compare-runs`

    rclc-graph experiment --topology T --data D.jsonl --arm NAME=POLICY ... [--arms-file F.yaml]
                          --out DIR [--limit N] [--json] [--trust-code] [--scorer module:fn]
                          [--compare-to ARM] [--concurrency N] [--max-batch N]
    rclc-graph data make --size N --seed S --out FILE [--family NAME] [--documents K]
    rclc-graph compare-runs DIR_A DIR_B [--json]

Problems found before any model runs (a bad arm, a case the topology cannot read) exit with
status 2 and the error's code and fix; an interrupted experiment exits with 130 and resumes
when the same command is run again.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import typer
import typer.core
from rich.text import Text
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import GraphError, UsageError
from ..render.consoles import command_console
from ..render.progress_lines import StepEstimate
from ..render.terminal_text import printable
from . import runner
from .arms import load_arms, parse_arms
from .inputs import parse_mapping
from .reproduce import compare_runs
from .summary import TABLE_WIDTH, format_p, table
from .datasets import write_jsonl
from .synthetic import write_dataset
from .tasks import FAMILIES, make_family

class UsageCommand(typer.core.TyperCommand):
    """A command whose usage line names arguments the way docs/cli.md writes them (`TOPOLOGY`,
    `[NAME]`), not as typer's `{topology}`. Every rclc-graph command uses it (views/cli.py too)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                name = name if param.required else f"[{name}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


app = typer.Typer(help="Experiments: compare handoff policies on a dataset.", no_args_is_help=True)
data_app = typer.Typer(help="Datasets for experiments.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _fail(error: Exception, as_json: bool) -> None:
    if as_json:
        payload: dict = {"error": str(error)}
        if isinstance(error, GraphError):
            payload["problems"] = [problem.to_dict() for problem in error.problems]
        typer.echo(json.dumps(payload, indent=2))
    else:
        command_console(stderr=True).print(Text("error: ", style="red") + Text(printable(error)))
    raise typer.Exit(2)


def _reporter(bar: Progress, lines_to: Any) -> Any:
    """The runner's progress callback: the bar on a terminal, and with `lines_to` (a console
    on a log or a pipe) one line per (case, arm) with the time left."""
    task = bar.add_task("cases x arms", total=None)
    started = time.monotonic()
    estimate: list[StepEstimate] = []

    def report(step: runner.Progress) -> None:
        verb = "resumed" if step.resumed else step.row.get("status", "")
        bar.update(task, total=step.total, completed=step.done, description=f"{step.case} / {step.arm} ({verb})")
        if lines_to is None:
            return
        if not estimate:
            estimate.append(StepEstimate(step.total, started))
        seconds = None if step.resumed else step.row.get("latency_s")
        lines_to.print(printable(estimate[0].line(step.done, f"{step.case} / {step.arm}", verb or "done",
                                                  computed=not step.resumed, seconds=seconds, now=time.monotonic())))

    return report


@app.command("experiment", cls=UsageCommand)
def experiment(  # a typer command: each option is a parameter (docs/cli.md lists them)
    topology: Path = typer.Option(..., "--topology", "-t", metavar="FILE", help="topology YAML file"),
    data: Path = typer.Option(..., "--data", "-d", metavar="FILE", help="JSONL dataset"),
    arm: List[str] = typer.Option([], "--arm", "-a", metavar="NAME=POLICY", help="NAME=MODE[:key=value,...], e.g. r4=state:ratio=4; repeatable"),
    arms_file: Optional[Path] = typer.Option(None, "--arms-file", metavar="FILE", help="YAML file with an `arms:` mapping"),
    out: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="results directory (rerun the same command to resume)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, metavar="N", help="use the first N cases"),
    as_json: bool = typer.Option(False, "--json", help="print summary.json instead of a table"),
    trust_code: bool = typer.Option(False, "--trust-code", help="allow module:callable selectors, methods and scorers"),
    scorer: Optional[str] = typer.Option(None, "--scorer", metavar="NAME", help="'containment' (default) or module:callable (needs --trust-code)"),
    seed: int = typer.Option(0, "--seed", min=0, metavar="N", help="run seed handed to the scheduler"),
    input_map: List[str] = typer.Option([], "--map", metavar="FIELD=INPUT", help="FIELD=INPUT: which topology input gets the case's question/documents"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="recompute rows whose run failed"),
    compare_to: Optional[str] = typer.Option(
        None, "--compare-to", metavar="ARM",
        help="arm every other arm is tested against (exact McNemar on the shared cases); default: the first arm",
    ),
    concurrency: int = typer.Option(
        1, "--concurrency", "-c", min=1, metavar="N", help="runs in flight at once (rows stay in order)"
    ),
    max_batch: Optional[int] = typer.Option(
        None, "--max-batch", min=1, metavar="N",
        help="sequences a model decodes together at most (default: the topology's, else 32)",
    ),
) -> None:
    """Run TOPOLOGY over DATA under every arm; write results.jsonl, summary.json, plots, report.md."""
    try:
        arms = []
        if arms_file is not None:
            arms += load_arms(arms_file)
        if arm:
            arms += parse_arms(arm)
        if not arms:
            raise UsageError("no arms given: pass --arm NAME=POLICY (e.g. --arm r4=state:ratio=4) or --arms-file")
        names = [a.name for a in arms]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise UsageError(f"arm names given twice (command line and --arms-file?): {', '.join(duplicates)}")
        if compare_to is not None and compare_to not in names:
            raise UsageError(f"--compare-to: no arm named {compare_to!r}; the arms are {', '.join(names)}")
        mapping = parse_mapping(input_map)
    except (GraphError, ValueError) as exc:
        _fail(exc, as_json)
        return

    console = command_console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    lines = not console.is_terminal and not as_json  # a log or a pipe: one line per case (render/progress_lines.py)
    if lines:
        console.print(printable(f"experiment {topology.name} over {data.name}: arms {', '.join(a.name for a in arms)}; "
                                "the first run loads the models"))
    with Progress(*columns, console=console, transient=as_json, disable=not console.is_terminal) as bar:
        report = _reporter(bar, console if lines else None)

        try:
            summary = runner.run_experiment(
                topology, data, arms, out, limit=limit, progress=report, trust_code=trust_code, scorer=scorer,
                seed=seed, input_map=mapping, retry_failed=retry_failed, compare_to=compare_to,
                concurrency=concurrency, max_batch=max_batch,
            )
        except KeyboardInterrupt:
            console.print(f"interrupted; finished rows are in {out}/results.jsonl; run the same command to resume")
            raise typer.Exit(130) from None
        except (GraphError, ValueError) as exc:
            bar.stop()
            _fail(exc, as_json)
            return
    if as_json:
        typer.echo(json.dumps(summary.data, indent=2, ensure_ascii=False))
        return
    out_console = command_console(min_width=TABLE_WIDTH)
    out_console.print(table(summary.data, title=f"{summary.data['topology']['name']}: {summary.data['cases']} cases"))
    rows = summary.data["rows"]
    out_console.print(
        f"{rows['computed']} runs computed, {rows['resumed']} resumed"
        + (f", {rows['recovered_bytes']} bytes of a torn row dropped" if rows["recovered_bytes"] else "")
        + f". Report: {summary.files['report']}"
    )


@data_app.command("make", cls=UsageCommand)
def data_make(
    size: int = typer.Option(..., "--size", "-n", min=1, metavar="N", help="number of cases"),
    seed: int = typer.Option(0, "--seed", "-s", min=0, metavar="N", help="same seed, same cases"),
    out: Path = typer.Option(..., "--out", "-o", metavar="FILE", help="JSONL file to write"),
    family: str = typer.Option(
        "single-fact", "--family", "-f", metavar="NAME",
        help=f"task family: {', '.join(FAMILIES)} (docs/experiments.md#task-families)",
    ),
    documents: str = typer.Option(
        "3", "--documents", "-k", metavar="N|LOW-HIGH",
        help="documents per case, N or LOW-HIGH (drawn per case; long family, or with --document-tokens); chain_of_agents reads 4",
    ),
    facts_per_document: Optional[int] = typer.Option(
        None, "--facts-per-document", min=1, metavar="N", help="single-fact: fact sentences per document (default 4)"
    ),
    filler_per_document: Optional[int] = typer.Option(
        None, "--filler-per-document", min=0, metavar="N", help="single-fact: neutral filler sentences per document (default 4)"
    ),
    document_tokens: Optional[str] = typer.Option(
        None, "--document-tokens", metavar="LOW-HIGH", help="long documents: each filled to LOW-HIGH word pieces "
        "(e.g. 300-600) with generated filler in paragraphs (single-fact; the long family's default is 300-600)"
    ),
) -> None:
    """Write a seeded multi-document question dataset of one task family (owners, places,
    dates, ... among distractors)."""
    try:
        count = _count_range("--documents", documents)
        tokens = None if document_tokens is None else _count_range("--document-tokens", document_tokens, pair=True)
        if family == "single-fact":
            written = write_dataset(
                out, size, seed=seed, documents=count,
                facts_per_document=4 if facts_per_document is None else facts_per_document,
                filler_per_document=4 if filler_per_document is None else filler_per_document, document_tokens=tokens,
            )
        else:
            for option, value in (("--facts-per-document", facts_per_document), ("--filler-per-document", filler_per_document)):
                if value is not None:
                    raise UsageError(f"{option}: only the single-fact family takes it, not {family!r}")
            written = write_jsonl(out, make_family(family, size, seed=seed, documents=count, document_tokens=tokens))
    except ValueError as exc:
        _fail(exc, False)
        return
    typer.echo(f"wrote {written} cases ({family}) to {out}")


def _count_range(option: str, text: str, *, pair: bool = False) -> Any:
    """`N` (or `N-N` when `pair`) or `LOW-HIGH` -> an int or a (low, high) pair; ValueError naming the option."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", text)
    if match is None:
        raise UsageError(f"{option}: expected a whole number N or a range LOW-HIGH, got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else None
    if high is None:
        return (low, low) if pair else low
    return (low, high)


@app.command("compare-runs", cls=UsageCommand)
def compare(
    first: Path = typer.Argument(..., metavar="DIR_A", help="an experiment directory"),
    second: Path = typer.Argument(..., metavar="DIR_B", help="another one, from a rerun of the same command"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON (reproduced, counts, differing rows, paired tests)"),
) -> None:
    """Check that a rerun reproduced the answers (greedy decoding, same graphs and models), and
    test per arm whether the two runs are right on the same cases (exact McNemar)."""
    try:
        result = compare_runs(first, second)
    except ValueError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        typer.echo(f"{result.identical}/{result.compared} comparable answers identical; "
                   f"{len(result.not_comparable)} rows not comparable")
        for item in result.differing[:20]:
            typer.echo(f"  differs: case {item['case']} arm {item['arm']}: {item['first']!r} != {item['second']!r}")
        for item in result.not_comparable[:5]:
            typer.echo(f"  not comparable: case {item['case']} arm {item['arm']}: {item['reason']}")
        for arm, pair in result.paired.items():
            typer.echo(
                f"  arm {arm}: right in both {pair.both_correct}, only first {pair.only_first}, only second "
                f"{pair.only_second}, neither {pair.both_wrong}; exact McNemar p={format_p(pair.p_value)}"
            )
    if not result.reproduced:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - for `python -m rclc_graph.experiments.commands`
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
