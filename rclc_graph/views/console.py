"""How the `rclc-graph` commands talk to a terminal: consoles, JSON output, errors, exit codes.

Every message is made `printable` (no control sequence from a file or a model reaches the
terminal). User mistakes never print a traceback: a GraphError prints each problem with its location,
field path, code and fix; any other ValueError prints its message; both exit with
EXIT_USAGE. Consoles that are not terminals (logs, pipes) never hard-wrap a line, and draw
tables 120 columns wide (`rclc_graph.render.consoles`).
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from ..errors import format_path, GraphError, UsageError
from ..render.consoles import command_console
from ..render.terminal_text import printable

EXIT_FAILED = 1  # a run failed, or `validate` found problems
EXIT_USAGE = 2  # a usage error: bad option, missing or malformed file, invalid topology or inputs
EXIT_WAITING = 3  # the run waits for a person's answer (continue it with `rclc-graph resume --answer`)
EXIT_INTERRUPTED = 130  # Ctrl-C (the nodes that finished are recorded)


def stdout_console() -> Console:
    """The console commands print results to (stdout); never hard-wrapped off a terminal."""
    return command_console()


def stderr_console() -> Console:
    """The console errors and notices go to (stderr), so stdout stays clean for `--json`."""
    return command_console(stderr=True)


def write_json(data: Any) -> None:
    """`--json` output: one indented UTF-8 JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_graph_error(console: Console, error: GraphError) -> None:
    """Every problem of `error`: where (file:line, field path), what, its code, and the fix."""
    count = len(error.problems)
    if count > 1:
        console.print(Text(f"{count} problems:", style="bold red"))
    for problem in error.problems:
        line = Text()
        if problem.location is not None:
            line.append(f"{printable(problem.location)}: ", style="bold")
        if problem.path:
            line.append(f"{printable(format_path(problem.path))}: ", style="cyan")
        line.append(printable(problem.message))
        line.append(f"  [{problem.code}]", style="dim")
        console.print(Text("error: ", style="bold red") + line, soft_wrap=True)
        console.print(Text("  fix: ", style="green") + Text(printable(problem.fix)), soft_wrap=True)


def fail(message: str, fix: str | None = None, code: int = EXIT_USAGE) -> NoReturn:
    """Print `message` (and `fix`) on stderr and exit with `code`."""
    console = stderr_console()
    console.print(Text("error: ", style="bold red") + Text(printable(message)), soft_wrap=True)
    if fix:
        console.print(Text("  fix: ", style="green") + Text(printable(fix)), soft_wrap=True)
    raise typer.Exit(code)


def parse_answers(items: list[str]) -> dict[str, str]:
    """`["final=yes", "review[0]=fix the date"]` (the CLI's --answer) -> {node: text}; the text
    is everything after the first '=' (it may hold '=' itself, or be empty)."""
    answers: dict[str, str] = {}
    for item in items:
        node, sep, text = item.partition("=")
        if not sep or not node.strip():
            raise UsageError(f"--answer: {item!r} is not NODE=TEXT; write e.g. --answer final='approved'")
        if node.strip() in answers:
            raise UsageError(f"--answer: node {node.strip()!r} is answered twice; give one answer per node")
        answers[node.strip()] = text
    return answers


def usage_error(error: Exception, code: int = EXIT_USAGE) -> NoReturn:
    """A user's mistake as one message plus the fix (no traceback), then exit with `code`."""
    if isinstance(error, GraphError):
        print_graph_error(stderr_console(), error)
        raise typer.Exit(code)
    message = str(error)
    fail(message)
