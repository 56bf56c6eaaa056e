"""`rclc-graph inspect RUN_DIR --node NAME`: what is specific to one node of a recorded run.

`inspect` without `--node` summarises the run (outputs, every hop, lineage per node); with
`--node` it used to print nearly the same. This view shows only the node: what it is (an agent
on which model, or a function), its status in this run (finished, skipped and why, waiting
and for what, not run), its timings and sizes, the decisions of the conditional edges that
touch it, the handoffs it received and sent, its tool calls, the person's answer, its prompt
and output, and (agents only) where its positions came from. Everything from the record goes
through `printable`/`Text`, as in terminal.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import UsageError
from ..render.terminal_text import printable, printable_data
from ..render.units import format_bytes, format_seconds
from ..run.record.format import NODES_DIR, safe_name
from .terminal import STATUS_STYLE, lineage_rows

SHOWN_CHARACTERS = 2000  # of a prompt or an output; the node file holds all of it


def _plan_node(record: dict[str, Any], name: str) -> dict[str, Any]:
    for node in (record.get("plan") or {}).get("nodes") or []:
        if isinstance(node, dict) and node.get("name") == name:
            return node
    known = ", ".join(str(node.get("name")) for node in (record.get("plan") or {}).get("nodes") or []
                      if isinstance(node, dict)) or "none"
    raise UsageError(f"node: the run has no node {name!r}; its nodes: {known}")


def _status(record: dict[str, Any], name: str) -> str:
    statuses = record.get("node_status") or {}
    if name in statuses:
        return str(statuses[name])
    if name in (record.get("nodes") or {}):
        return "finished"
    return "skipped" if name in (record.get("skipped") or {}) else "not run"


def _what(plan_node: dict[str, Any]) -> str:
    if plan_node.get("call"):
        return f"function {plan_node['call']}"
    where = [f"agent {plan_node.get('agent')}", f"model {plan_node.get('model')}"]
    if not plan_node.get("generate", True):
        where.append("reads only (generate: false)")
    return ", ".join(where)


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS] + f" … ({len(text)} characters)"


def _head(console: Console, record: dict[str, Any], name: str, plan_node: dict[str, Any]) -> None:
    status = _status(record, name)
    mark, style = STATUS_STYLE.get(status, ("?", ""))
    title = Text(name, style="bold")
    title.append(f"  {mark} {status}", style=style)
    title.append(f"   {record.get('graph')} run {record.get('run_id')}", style="dim")
    console.print(title)
    facts = [_what(plan_node)]
    if plan_node.get("declared") not in (None, name):
        facts.append(f"declared as {plan_node['declared']}")
    if plan_node.get("index") is not None:
        facts.append(f"foreach item {plan_node['index']}")
    if plan_node.get("round") is not None:
        facts.append(f"round {plan_node['round']}")
    if plan_node.get("output"):
        facts.append("an output")
    if plan_node.get("interrupt"):
        facts.append(f"interrupt: {plan_node['interrupt']}")
    console.print(Text("  " + "; ".join(facts)))
    senders = plan_node.get("senders") or []
    receivers = [edge.get("target") for edge in (record.get("plan") or {}).get("edges") or []
                 if isinstance(edge, dict) and edge.get("source") == name]
    console.print(Text(f"  reads from: {', '.join(senders) or 'no node'}; sends to: {', '.join(receivers) or 'no node'}",
                       style="dim"))


def _state(console: Console, record: dict[str, Any], name: str) -> None:
    """Why it did not run, or what it waits for."""
    reason = (record.get("skipped") or {}).get(name)
    if reason:
        console.print(Text("  skipped: ", style="bold") + Text(str(reason)))
    for item in record.get("waiting") or []:
        if isinstance(item, dict) and item.get("node") == name:
            console.print(Text(f"  waits for a person ({item.get('interrupt')}): ", style="bold magenta")
                          + Text(str(item.get("question", ""))))
            for sender, text in (item.get("shown") or {}).items():
                console.print(Text(f"    shown {sender}: ", style="dim") + Text(_cut(str(text))))
            console.print(Text(f"  answer it: rclc-graph resume RUN_DIR --answer {name}='...'", style="magenta"))
    answer = (record.get("answers") or {}).get(name)
    if answer is not None:
        console.print(Text("  answered: ", style="bold") + Text(str(answer)))
    if record.get("failed_node") == name and record.get("error"):
        console.print(Text("  failed: ", style="bold red") + Text(str(record["error"])))


def _edges(console: Console, record: dict[str, Any], name: str) -> None:
    """Decisions of conditional edges that touch the node, and the handoffs in and out."""
    fired = record.get("fired") or {}
    decided = []
    for edge in (record.get("plan") or {}).get("edges") or []:
        if not isinstance(edge, dict) or name not in (edge.get("source"), edge.get("target")):
            continue
        key = f"{edge.get('source')}->{edge.get('target')}"
        decision = fired[key] if key in fired else fired.get(str(edge.get("id")))  # older records: by edge id
        if decision is not None:
            decided.append(f"{edge.get('source')} → {edge.get('target')}: {'fired' if decision else 'did not fire'}")
    if decided:
        console.print(Text("  conditional edges: ", style="bold") + Text("; ".join(decided)))
    hops = [hop for hop in record.get("hops") or [] if isinstance(hop, dict) and name in (hop.get("source"), hop.get("target"))]
    if not hops:
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
    for column, justify in (("handoff", "left"), ("policy", "left"), ("T", "right"), ("kept", "right"),
                            ("payload", "right"), ("select", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for hop in hops:
        text_edge = hop.get("mode") == "text"
        direction = "in" if hop.get("target") == name else "out"
        table.add_row(Text(f"{direction}: {hop.get('source')} → {hop.get('target')}"), Text(str(hop.get("policy"))),
                      "–" if text_edge else str(hop.get("total_positions")),
                      "–" if text_edge else str(hop.get("kept_positions")),
                      format_bytes(hop.get("payload_bytes") or 0),
                      format_seconds(hop.get("selection_seconds"), decimals=3, missing=""))
    console.print()
    console.print(Text("Handoffs", style="bold underline"))
    console.print(table)


def _result(console: Console, data: dict[str, Any], run_dir: str | None) -> None:
    """Figures, tool calls, prompt, output and (agents) lineage of a finished node."""
    function = data.get("kind") == "function"
    seconds = max(0.0, float(data.get("finished_at") or 0) - float(data.get("started_at") or 0))
    figures = [f"ran {format_seconds(seconds, decimals=2)}"]
    if not function:
        figures += [f"{data.get('positions')} positions ({data.get('inherited_positions')} inherited)",
                    f"{data.get('generated_tokens')} tokens generated in "
                    f"{format_seconds(data.get('generation_seconds'), decimals=2)}"]
    if data.get("placement"):
        figures.append(f"on {data['placement'].get('replica')}")
    console.print(Text("  " + "; ".join(figures)))
    for call in data.get("tool_calls") or []:
        line = Text(f"  tool {call.get('name')}({call.get('arguments')})", style="cyan")
        outcome = f"error: {call.get('error')}" if call.get("error") else call.get("result")
        console.print(line + Text(f" → {_cut(str(outcome))}"))
    if not function and data.get("prompt_text"):
        console.print()
        console.print(Text("Prompt", style="bold underline"), Text("  as the model read it (chat template applied)", style="dim"))
        console.print(Text(_cut(str(data["prompt_text"]))))
    console.print()
    console.print(Text("Output", style="bold underline"))
    console.print(Text(_cut(str(data.get("text"))) if data.get("text") is not None else "(reads only: no text)"))
    if function:
        console.print(Text("  a function node holds no model state: no positions, no lineage", style="dim"))
    else:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, header_style="bold", pad_edge=False)
        for column, justify in (("origin", "left"), ("kind", "left"), ("hops crossed", "right"), ("positions", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for origin, kind, hops_crossed, count in lineage_rows(data):
            table.add_row(Text(origin), Text(kind), str(hops_crossed), str(count))
        console.print()
        console.print(Text("Lineage", style="bold underline"),
                      Text("  who created its positions, as what, how many handoffs ago", style="dim"))
        console.print(table)
    if run_dir is not None:
        stem = safe_name(str(data.get("node")))
        console.print()
        console.print(Text("node file  ", style="bold") + Text(f"{printable(run_dir)}/{NODES_DIR}/{stem}.json"))
        if not function and (Path(run_dir) / NODES_DIR / f"{stem}.safetensors").is_file():
            console.print(Text("snapshot   ", style="bold") + Text(f"{printable(run_dir)}/{NODES_DIR}/{stem}.safetensors"))


def render_node(console: Console, record: dict[str, Any], name: str, run_dir: str | None = None) -> None:
    """What is specific to node `name` of a run record (UsageError naming the nodes for an unknown one)."""
    record = printable_data(record)
    plan_node = _plan_node(record, name)
    _head(console, record, name, plan_node)
    _state(console, record, name)
    _edges(console, record, name)
    data = (record.get("nodes") or {}).get(name)
    if data is not None:
        console.print()
        _result(console, data, run_dir)
