"""The report's "Tool calls" section: every call a tool-calling node made, with its result.

Its own module so report.html's main renderer stays one job; it reads the same plain
record data (each node's `tool_calls`, tools.ToolRun.to_dict()) and escapes everything, as
tool arguments and results are text a model or a tool produced.
"""

from __future__ import annotations

import html
import json
from typing import Any

from .units import format_seconds

MAX_RESULT_CHARS = 2000  # per result shown; record.json holds the whole text


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def tool_calls_section(record: dict[str, Any]) -> str:
    """The section's HTML, or "" when no node called a tool."""
    rows = []
    for name, data in record.get("nodes", {}).items():
        for call in data.get("tool_calls") or []:
            arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, sort_keys=True)
            result = str(call.get("result", ""))
            if len(result) > MAX_RESULT_CHARS:
                result = result[:MAX_RESULT_CHARS] + " …"
            status = (
                f"<span class='bad'>{_e(call['error'])}</span>" if call.get("error") else "<span class='ok'>ok</span>"
            )
            rows.append(
                f"<tr><td>{_e(name)}</td><td class='mono'>{_e(call.get('call_id', ''))}</td>"
                f"<td><b>{_e(call.get('name', ''))}</b></td><td class='mono'>{_e(arguments)}</td>"
                f"<td class='text'>{_e(result)}</td><td>{status}</td>"
                f"<td class='n'>{_e(format_seconds(float(call.get('seconds') or 0.0)))}</td></tr>"
            )
    if not rows:
        return ""
    head = ("<tr><th>node</th><th>call</th><th>tool</th><th>arguments</th><th>result (what the model read)</th>"
            "<th>status</th><th>time</th></tr>")
    explain = (
        '<p class="note">Calls in the order each node made them. A tool that raised, timed out, was unknown or got '
        "bad arguments answered with an error result; the node went on. Tool results are in the node's state as "
        "positions of kind <i>tool</i> (see Lineage).</p>"
    )
    return f"<section><h2>Tool calls</h2><table>{head}{''.join(rows)}</table>{explain}</section>"
