"""Terminal views for the CLI: live progress fed by a run's events, and a record's summary.

Every string that came from a model, a document or a file is put in a rich `Text` (never
parsed as markup), so generated text such as "[bold]" or "[/]" prints as written, and made
`printable` first (render/terminal_text.py), so no control sequence in it reaches the terminal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..plan.dag import Plan
from ..render.html_report import hops_text
from ..render.terminal_text import printable, printable_data
from ..render.units import format_bytes, format_seconds
from ..results.events import EventStream

STATUS_STYLE = {
    "pending": ("·", "dim"),  # not started yet
    "running": ("▶", "bold cyan"),
    "finished": ("✓", "green"),
    "failed": ("✗", "bold red"),
    "cancelled": ("■", "yellow"),
    "crashed": ("✗", "bold red"),
    "skipped": ("–", "dim"),  # none of its inbound edges fired
    "waiting": ("?", "bold magenta"),  # waits for a person's answer
}
MAX_LIVE_ROWS = 24


def _clip(text: str, width: int) -> str:
    """One line of at most `width` characters (tool results can be long JSON)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _seconds(value: float | None) -> str:
    return format_seconds(value, decimals=1, missing="")


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else "…" + flat[-(width - 1):]


# -- live progress -----------------------------------------------------------------------------


class ProgressView:
    """Reads a run's EventStream and shows each node's state.

    On a terminal: a live table (running nodes, their token counts and latest text). Else
    (pipes, CI logs): one line per node that finishes or fails, nothing that redraws.
    """

    def __init__(self, plan: Plan, console: Console, *, quiet: bool = False) -> None:
        self.plan = plan
        self.console = console
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self.status: dict[str, str] = {name: "pending" for name in plan.order}
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.tokens: dict[str, int] = {}
        self.tail: dict[str, str] = {}
        self.received: dict[str, list[str]] = {}
        self.calls: dict[str, dict[str, str]] = {}  # node -> call id -> "tool(arguments)"
        self.positions: dict[str, int] = {}
        self.notes: list[str] = []
        self.begun = time.perf_counter()

    # event handling (runs in the event loop)
    def handle(self, event: Any) -> None:
        payload = printable_data(event.payload)
        if event.kind == "node":
            name = payload["node"]
            if payload["status"] == "started":
                self.status[name] = "running"
                self.started[name] = time.perf_counter()
            elif payload["status"] == "finished":
                self.status[name] = "finished"
                self.ended[name] = time.perf_counter()
                self.positions[name] = payload.get("positions", 0)
                self._print_finished(name)
            elif payload["status"] in ("skipped", "waiting"):
                self.status[name] = payload["status"]
                detail = payload.get("reason") if payload["status"] == "skipped" else payload.get("question")
                self.received.setdefault(name, []).append(str(detail or ""))
                self._print_settled(name, payload["status"], str(detail or ""))
        elif event.kind == "token":
            name = payload["node"]
            self.tokens[name] = self.tokens.get(name, 0) + 1
            self.tail[name] = (self.tail.get(name, "") + payload.get("text", ""))[-400:]
        elif event.kind == "hop":
            if payload["mode"] == "text":
                line = f"text from {payload['source']}"
            else:
                line = (
                    f"kept {payload['kept_positions']}/{payload['total_positions']} from {payload['source']}"
                    f" ({payload['policy']})"
                )
            self.received.setdefault(payload["target"], []).append(line)
        elif event.kind == "tool":  # a tool loop's call, then its result, before the node finishes
            if payload["phase"] == "call":
                line = f"{payload['name']}({json.dumps(payload['arguments'], ensure_ascii=False)[1:-1]})"
                self.calls.setdefault(payload["node"], {})[payload["call_id"]] = line
            else:
                call = self.calls.get(payload["node"], {}).get(payload["call_id"], payload["name"])
                outcome = f"error: {payload['error']}" if payload["error"] else str(payload["result"])
                self.received.setdefault(payload["node"], []).append(f"tool {call} -> {_clip(outcome, 90)}")
        elif event.kind == "error":
            name = payload.get("node")
            if name in self.status:
                self.status[name] = "failed"
                self.ended[name] = time.perf_counter()
            if not self.live and not self.quiet:
                self.console.print(Text(f"  ✗ {name}: {payload.get('message', '')}", style="red"))
        elif event.kind == "cancelled":
            for name, status in self.status.items():
                if status == "running":
                    self.status[name] = "cancelled"

    def _print_finished(self, name: str) -> None:
        if self.live or self.quiet:
            return
        took = self.ended[name] - self.started.get(name, self.ended[name])
        line = Text("  ✓ ", style="green")
        line.append(name, style="bold")
        line.append(f"  {self.positions[name]} positions, {_seconds(took)}")
        if self.tokens.get(name):
            line.append(f", {self.tokens[name]} tokens generated")
        for received in self.received.get(name, []):
            line.append(f"\n      ← {received}", style="dim")
        self.console.print(line)

    def _print_settled(self, name: str, status: str, detail: str) -> None:
        if self.live or self.quiet:
            return
        mark, style = STATUS_STYLE[status]
        line = Text(f"  {mark} ", style=style)
        line.append(name, style="bold" if status == "waiting" else "dim")
        line.append(f"  {status}: ", style=style)
        line.append(detail, style="dim" if status == "skipped" else "")
        self.console.print(line)

    async def consume(self, events: EventStream) -> None:
        if not self.live:
            async for event in events:
                self.handle(event)
            return
        with Live(self, console=self.console, refresh_per_second=8, transient=False):
            async for event in events:
                self.handle(event)

    # rendering (rich calls this from its refresh thread; it only reads)
    def __rich__(self) -> Any:
        total = len(self.status)
        done = sum(1 for status in self.status.values() if status == "finished")
        now = time.perf_counter()
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("")
        table.add_column("node")
        table.add_column("positions", justify="right")
        table.add_column("time", justify="right")
        table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=70)
        names = list(self.status)
        if len(names) > MAX_LIVE_ROWS:
            running = [name for name in names if self.status[name] in ("running", "failed", "cancelled", "waiting")]
            finished = [name for name in names if self.status[name] == "finished"][-(MAX_LIVE_ROWS // 2):]
            names = [name for name in names if name in set(running) | set(finished)][:MAX_LIVE_ROWS]
        for name in names:
            status = self.status[name]
            mark, style = STATUS_STYLE[status]
            start = self.started.get(name)
            took = None if start is None else self.ended.get(name, now) - start
            detail = ""
            if status == "running" and self.tail.get(name):
                count = self.tokens.get(name, 0)
                detail = f"{count} token{'' if count == 1 else 's'}: " + _one_line(self.tail[name], 50)
            elif self.received.get(name):
                detail = "; ".join(self.received[name])
            table.add_row(
                Text(mark, style=style),
                Text(name, style="bold" if status == "running" else ""),
                str(self.positions.get(name, "")),
                _seconds(took),
                Text(detail, style="dim"),
            )
        title = Text(f"{self.plan.name}: {done}/{total} nodes finished, {_seconds(now - self.begun)}", style="bold")
        return Group(title, table)


# -- a record, summarised ----------------------------------------------------------------------


def lineage_rows(node: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    """(origin node, kind, hops crossed, positions), merged over segments, in state order."""
    merged: dict[tuple[str, str, int], int] = {}
    for origin, kind, hops, _start, length in node["lineage"]["segments"]:
        merged[(origin, kind, hops)] = merged.get((origin, kind, hops), 0) + length
    return [(origin, kind, hops, count) for (origin, kind, hops), count in merged.items()]


def _status_text(status: str) -> Text:
    mark, style = STATUS_STYLE.get(status, ("?", ""))
    return Text(f"{mark} {status}", style=style)


def _print_waiting(console: Console, record: dict[str, Any], run_dir: str | None) -> None:
    """Who the run waits for, what they are asked and shown, and the command that answers."""
    waiting = record.get("waiting") or []
    if record.get("status") != "waiting" or not waiting:
        return
    console.print()
    console.print(Text("Waiting for your answer", style="bold magenta underline"))
    for item in waiting:
        line = Text(f"  {item.get('node')}", style="bold")
        line.append(f" ({item.get('interrupt')}): ")
        line.append(str(item.get("question", "")))
        console.print(line)
        for name, text in (item.get("shown") or {}).items():
            console.print(Text(f"    {name}: ", style="dim") + Text(_one_line(str(text), 300)))
    first = waiting[0].get("node")
    where = run_dir if run_dir is not None else f"runs/{record.get('run_id')}"
    console.print(Text(f"continue with: rclc-graph resume {where} --answer {first}='...'", style="magenta"))


def _print_skipped(console: Console, record: dict[str, Any]) -> None:
    skipped = record.get("skipped") or {}
    if not skipped:
        return
    outputs = {node["name"] for node in record.get("plan", {}).get("nodes", []) if node.get("output")}
    console.print()
    console.print(Text("Skipped", style="bold underline"), Text("  nodes that did not run, and why", style="dim"))
    for name, reason in skipped.items():
        line = Text(f"  – {name}", style="bold" if name in outputs else "dim")
        if name in outputs:
            line.append(" (output: left out of Outputs)", style="yellow")
        line.append(f": {reason}", style="dim")
        console.print(line)


def render_record(
    console: Console, record: dict[str, Any], run_dir: str | None = None, *, every_node: bool = False,
) -> None:
    """Status, outputs, hops and lineage (of output nodes, or of every node) of a run record
    (one node's own view is node_view.py)."""
    record = printable_data(record)
    _print_status(console, record, run_dir)
    outputs = record.get("outputs", {})
    if outputs:
        console.print()
        console.print(Text("Outputs", style="bold underline"))
        for name, text in outputs.items():
            line = Text(f"  {name}: ", style="bold green")
            line.append(str(text))
            console.print(line)
    if record.get("hops", []):
        _print_hops(console, record["hops"])
    nodes = record.get("nodes", {})
    if every_node and nodes:
        _print_lineage_per_node(console, nodes)
    for name in [name for name in outputs if name in nodes]:
        _print_lineage_of(console, nodes, name)
    if run_dir is not None:
        _print_files(console, run_dir)


def _print_status(console: Console, record: dict[str, Any], run_dir: str | None) -> None:
    """The title line (graph, status, time, run id), the error, and who did not finish, skipped or waits."""
    title = Text()
    title.append(str(record.get("graph", "run")), style="bold")
    title.append("  ")
    title.append_text(_status_text(record.get("status", "?")))
    seconds = record.get("timings", {}).get("seconds")
    if seconds:
        title.append(f" in {_seconds(seconds)}")
    title.append(f"   run {record.get('run_id')}", style="dim")
    console.print(title)
    if record.get("error"):
        console.print(Text("error: ", style="bold red") + Text(str(record["error"])))
    unfinished = record.get("unfinished") or []
    if unfinished and record.get("status") not in ("finished", "waiting"):
        console.print(Text(f"not finished: {', '.join(unfinished)}", style="yellow"))
    _print_waiting(console, record, run_dir)
    _print_skipped(console, record)


def _table(*columns: str, right: tuple[str, ...] = ()) -> Table:
    """A table in the record's style; the `right` columns are right-aligned."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def _print_hops(console: Console, hops: list[dict[str, Any]]) -> None:
    """The handoffs table: policy, T, I, budget, kept (by origin), payload and selection time per hop."""
    console.print()
    table = _table("handoff", "policy", "T", "I", "budget", "kept", "kept by origin", "payload", "select",
                   right=("T", "I", "budget", "kept", "payload", "select"))
    for hop in hops:
        text_edge = hop["mode"] == "text"
        table.add_row(
            Text(f"{hop['source']} → {hop['target']}"),
            Text(str(hop["policy"])),
            "–" if text_edge else str(hop["total_positions"]),
            "–" if text_edge else str(hop["inherited_positions"]),
            "–" if text_edge else str(hop["budget"]),
            "–" if text_edge else str(hop["kept_positions"]),
            Text("text" if text_edge else ", ".join(f"{k} {v}" for k, v in hop["kept_by_origin"].items())),
            format_bytes(hop["payload_bytes"]),
            _seconds(hop["selection_seconds"]),
        )
    console.print(Text("Handoffs", style="bold underline"),
                  Text("  T: positions the sender held, I: of which it had inherited", style="dim"))
    console.print(table)


def _print_lineage_per_node(console: Console, nodes: dict[str, Any]) -> None:
    """One row per finished node: its positions by origin node, kind and hops crossed."""
    console.print()
    console.print(Text("Lineage per node", style="bold underline"),
                  Text("  where each node's positions came from", style="dim"))
    table = _table("node", "positions", "by origin node", "by kind", "by hops crossed", right=("positions",))
    for name in nodes:
        summary = nodes[name]["lineage_summary"]
        table.add_row(
            Text(name),
            str(summary["positions"]),
            Text(", ".join(f"{k} {v}" for k, v in summary["by_node"].items())),
            Text(", ".join(f"{k} {v}" for k, v in summary["by_kind"].items())),
            Text(", ".join(hops_text(int(k), v) for k, v in summary["by_hops"].items())),
        )
    console.print(table)


def _print_lineage_of(console: Console, nodes: dict[str, Any], name: str) -> None:
    """Node `name`'s lineage (a finished node): who created its positions, as what, how many handoffs ago."""
    data = nodes[name]
    console.print()
    console.print(Text(f"Lineage of {name}", style="bold underline"),
                  Text(f"  {data['positions']} positions, {data['inherited_positions']} inherited: who created "
                       "them, as what, how many handoffs ago", style="dim"))
    table = _table("origin", "kind", "hops crossed", "positions", right=("hops crossed", "positions"))
    for origin, kind, hops_crossed, count in lineage_rows(data):
        table.add_row(Text(origin), Text(kind), str(hops_crossed), str(count))
    console.print(table)


def _print_files(console: Console, run_dir: str) -> None:
    """Where the record and the report are."""
    shown = printable(run_dir)
    console.print()
    console.print(Text("record  ", style="bold") + Text(f"{shown}/record.json"))
    if (Path(run_dir) / "report.html").is_file():
        console.print(Text("report  ", style="bold") + Text(f"{shown}/report.html") +
                      Text("  (open it in a browser: graph, kept spans, lineage)", style="dim"))
    else:
        console.print(Text("report  ", style="bold") + Text("none yet", style="dim") +
                      Text("  (report.html is written when a run or resume ends)", style="dim"))
