"""report.html: one self-contained page per run (inline CSS and SVG, no script, no network).

It shows the graph, every hop's figures, the lineage of every node, which prompt tokens of
each node survived into each node downstream, and the outputs. It is rendered from the
record alone (`render_report(read_record(run_dir))`), so an old run can be re-rendered.

Everything that came from a model, a document or a user (outputs, prompts, inputs, names)
passes through `html.escape` before it reaches the page; the page has no <script>.
"""

from __future__ import annotations

import datetime
import html
import json
from typing import Any, Iterable

from .composition_report import runtime_foreach_section, subgraphs_section
from .drawing import Sketch, sketch_record, to_svg
from .tool_report import tool_calls_section
from .units import format_bytes, format_seconds

MAX_SPAN_VIEWS = 400  # (origin, holder) prompt views shown; a note says when more were left out
MAX_PROMPT_CHARS = 20_000  # per view; longer prompts are cut with a note
MAX_TEXT_CHARS = 20_000  # per output, node text or waiting text; the rest is in the node's file


def _text(value: Any, where: str = "") -> str:
    """A text from the record, escaped, cut at MAX_TEXT_CHARS with a note saying where the
    whole text is (a 125 MB output made a 125 MB report)."""
    text = str(value)
    if len(text) <= MAX_TEXT_CHARS:
        return _e(text)
    rest = f"; all of it is in {_e(where)}" if where else ""
    return (f"{_e(text[:MAX_TEXT_CHARS])}<span class=\"note\"> … ({len(text) - MAX_TEXT_CHARS} more characters "
            f"not shown{rest})</span>")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _when(stamp: float | None) -> str:
    if not stamp:
        return "–"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


# -- what survived where -----------------------------------------------------------------------


def kept_prompt_tokens(record: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """origin node -> holder node -> {"tokens": sorted prompt-token indices of the origin
    that the holder's state contains, "hops": sorted hop counts, "generated": how many of the
    origin's generated tokens the holder holds}. Holders are other nodes only."""
    nodes = record.get("nodes", {})
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for holder, data in nodes.items():
        for origin, kind, hops, start, length in data["lineage"]["segments"]:
            if origin == holder or origin not in nodes:
                continue
            entry = found.setdefault(origin, {}).setdefault(holder, {"tokens": set(), "hops": set(), "generated": 0})
            entry["hops"].add(hops)
            if kind == "prompt":
                first = nodes[origin]["prompt_start"]
                entry["tokens"].update(index - first for index in range(start, start + length))
            elif kind == "token":
                entry["generated"] += length
    order = {name: index for index, name in enumerate(record.get("plan", {}).get("order", []) or _order(record))}
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for origin in sorted(found, key=lambda name: order.get(name, 0)):
        result[origin] = {
            holder: {"tokens": sorted(entry["tokens"]), "hops": sorted(entry["hops"]), "generated": entry["generated"]}
            for holder, entry in sorted(found[origin].items(), key=lambda item: order.get(item[0], 0))
        }
    return result


def _order(record: dict[str, Any]) -> list[str]:
    return [node["name"] for node in record.get("plan", {}).get("nodes", [])]


def marked_prompt(text: str, offsets: list[list[int]], kept: Iterable[int], colour: str) -> str:
    """The prompt as escaped HTML with kept tokens wrapped in <mark>; characters no token
    covers are shown unmarked."""
    kept_set = set(kept)
    pieces: list[str] = []
    cursor = 0
    limit = min(len(text), MAX_PROMPT_CHARS)
    for index, pair in enumerate(offsets):
        start, end = int(pair[0]), int(pair[1])
        if start >= limit:
            break
        end = min(end, limit)
        if start > cursor:
            pieces.append(_e(text[cursor:start]))
        start = max(start, cursor)
        if end > start:
            piece = _e(text[start:end])
            pieces.append(f'<mark style="background:{colour}55">{piece}</mark>' if index in kept_set else piece)
        cursor = max(cursor, end)
    if cursor < limit:
        pieces.append(_e(text[cursor:limit]))
    if len(text) > limit:
        pieces.append(f'<span class="note"> … ({len(text) - limit} more characters not shown)</span>')
    return "".join(pieces)


# -- sections ----------------------------------------------------------------------------------


def _status_badge(status: str) -> str:
    return f'<span class="badge {_e(status)}">{_e(status)}</span>'


def _header(record: dict[str, Any]) -> str:
    timings = record.get("timings", {})
    topology = record.get("topology", {})
    facts = [
        ("run", record.get("run_id")),
        ("started", _when(timings.get("started_at"))),
        ("took", format_seconds(timings.get("seconds"))),
        ("nodes", f"{len(record.get('nodes', {}))} of {len(record.get('plan', {}).get('nodes', []))} finished"),
        ("seed", record.get("seeds", {}).get("run")),
        ("topology", topology.get("file") or "(built in Python)"),
    ]
    items = "".join(f"<span><b>{_e(name)}</b> {_e(value)}</span>" for name, value in facts)
    description = record.get("topology", {}).get("spec", {}).get("description") or ""
    error = ""
    if record.get("error"):
        error = f'<div class="error"><b>Error</b> {_e(record["error"])}</div>'
    return (
        f"<header><h1>{_e(record.get('graph', 'run'))} {_status_badge(record.get('status', '?'))}</h1>"
        f'<p class="description">{_e(description)}</p><div class="facts">{items}</div>{error}'
        f"{_waiting(record)}</header>"
    )


def _waiting(record: dict[str, Any]) -> str:
    """Who the run waits for, what they are asked and shown, and the command that answers."""
    waiting = record.get("waiting") or []
    if record.get("status") != "waiting" or not waiting:
        return ""
    blocks = []
    for item in waiting:
        shown = "".join(
            f'<div class="label">{_e(name)}</div><div class="text">{_text(text, "its node file in nodes/")}</div>'
            for name, text in (item.get("shown") or {}).items()
        )
        blocks.append(
            f"<p><b>{_e(item.get('node'))}</b> ({_e(item.get('interrupt'))}): {_e(item.get('question'))}</p>{shown}"
        )
    command = f"rclc-graph resume runs/{record.get('run_id')} --answer {waiting[0].get('node')}='...'"
    return (f'<div class="waiting"><b>Waiting for a person</b>{"".join(blocks)}'
            f'<p class="mono">{_e(command)}</p></div>')


def _skipped(record: dict[str, Any]) -> str:
    skipped = record.get("skipped") or {}
    if not skipped:
        return ""
    outputs = {node["name"] for node in record.get("plan", {}).get("nodes", []) if node.get("output")}
    rows = "".join(
        f"<tr class='skipped'><td>{_e(name)}{' (output)' if name in outputs else ''}</td><td>{_e(reason)}</td></tr>"
        for name, reason in skipped.items()
    )
    explain = ('<p class="note">A node runs when at least one of its inbound edges fired; these did not run '
               "(greyed in the graph), so they hold no state and passed nothing on. An output node among them "
               "is left out of Outputs.</p>")
    return f"<section><h2>Skipped</h2><table><tr><th>node</th><th>why</th></tr>{rows}</table>{explain}</section>"


def _outputs(record: dict[str, Any]) -> str:
    outputs = record.get("outputs", {})
    if not outputs:
        return '<section><h2>Outputs</h2><p class="note">No output node finished.</p></section>'
    cards = "".join(
        f'<div class="output"><div class="label">{_e(name)}</div><div class="text">{_text(text, "record.json")}</div></div>'
        for name, text in outputs.items()
    )
    return f"<section><h2>Outputs</h2>{cards}</section>"


def _graph(record: dict[str, Any], sketch: Sketch) -> str:
    legend = (
        '<div class="legend"><span><i class="line state"></i>state edge</span>'
        '<span><i class="line full"></i>full state</span><span><i class="line text"></i>text edge</span>'
        '<span><i class="box dashed"></i>reads only (no decoding)</span>'
        '<span><i class="box bold"></i>output node</span>'
        '<span><i class="box grey"></i>skipped node / edge that did not fire</span>'
        "<span>edge labels: policy: positions kept / positions the sender held</span></div>"
    )
    return f'<section><h2>Graph</h2><div class="graph">{to_svg(sketch)}</div>{legend}</section>'


def _origin_bar(counts: dict[str, int], sketch: Sketch, total: int | None = None) -> str:
    total = total or sum(counts.values()) or 1
    parts = "".join(
        f'<span style="width:{100 * count / total:.2f}%;background:{sketch.colour(name)}" '
        f'title="{_e(name)}: {count}"></span>'
        for name, count in counts.items()
        if count
    )
    text = ", ".join(f"{_e(name)} {count}" for name, count in counts.items())
    return f'<div class="bar">{parts}</div><div class="small">{text}</div>'


def _hops(record: dict[str, Any], sketch: Sketch) -> str:
    hops = record.get("hops", [])
    if not hops:
        return '<section><h2>Handoffs</h2><p class="note">No handoff happened.</p></section>'
    rows = []
    for hop in hops:
        is_text = hop["mode"] == "text"
        rows.append(
            "<tr>"
            f"<td>{_e(hop['source'])} → {_e(hop['target'])}</td>"
            f"<td>{_e(hop['policy'])}</td>"
            f"<td class='n'>{'–' if is_text else hop['total_positions']}</td>"
            f"<td class='n'>{'–' if is_text else hop['inherited_positions']}</td>"
            f"<td class='n'>{'–' if is_text else hop['budget']}</td>"
            f"<td class='n'>{'–' if is_text else hop['kept_positions']}</td>"
            f"<td class='wide'>{'text' if is_text else _origin_bar(hop['kept_by_origin'], sketch)}</td>"
            f"<td class='n'>{format_bytes(hop['payload_bytes'])}</td>"
            f"<td class='n'>{format_seconds(hop['selection_seconds'])}</td>"
            f"<td class='n'>{format_seconds(hop['generation_seconds']) if hop['generation_seconds'] else '–'}</td>"
            "</tr>"
        )
    head = (
        "<tr><th>edge</th><th>policy</th><th title='positions the sender held (T)'>T</th>"
        "<th title='of which the sender had inherited (I)'>I</th><th>budget</th><th>kept</th>"
        "<th>kept by origin</th><th>payload</th><th>selection</th><th>receiver generation</th></tr>"
    )
    explain = (
        '<p class="note">T: positions of the sender\'s state the selector saw; I: how many of those '
        "the sender had itself inherited; budget: positions the policy allowed on this hop; kept: "
        "positions delivered. Payload is what travelled (input rows).</p>"
    )
    return f"<section><h2>Handoffs</h2><table>{head}{''.join(rows)}</table>{explain}</section>"


def hops_text(hops: int, count: int) -> str:
    """'44 own' for positions a node created itself, '17 after 1 hop' for inherited ones."""
    if hops == 0:
        return f"{count} own"
    return f"{count} after {hops} hop{'s' if hops > 1 else ''}"


def _lineage(record: dict[str, Any], sketch: Sketch) -> str:
    rows = []
    for name, data in record.get("nodes", {}).items():
        summary = data.get("lineage_summary") or record.get("lineage", {}).get(name, {})
        kinds = ", ".join(f"{_e(kind)} {count}" for kind, count in summary.get("by_kind", {}).items())
        hops = ", ".join(hops_text(int(hops), count) for hops, count in summary.get("by_hops", {}).items())
        rows.append(
            f"<tr><td><span class='dot' style='background:{sketch.colour(name)}'></span>{_e(name)}</td>"
            f"<td class='n'>{data['positions']}</td><td class='n'>{data['inherited_positions']}</td>"
            f"<td class='wide'>{_origin_bar(summary.get('by_node', {}), sketch, data['positions'])}</td>"
            f"<td>{kinds}</td><td>{hops}</td></tr>"
        )
    if not rows:
        return ""
    head = (
        "<tr><th>node</th><th>positions</th><th>inherited</th><th>positions by origin node</th>"
        "<th>by kind</th><th>by hops crossed</th></tr>"
    )
    explain = (
        '<p class="note">Every position a node holds knows the node that created it, its kind '
        "(prompt, generated token, latent row, tool result) and how many edges it crossed to get here.</p>"
    )
    return f"<section><h2>Lineage</h2><table>{head}{''.join(rows)}</table>{explain}</section>"


def _spans(record: dict[str, Any], sketch: Sketch) -> str:
    nodes = record.get("nodes", {})
    survived = kept_prompt_tokens(record)
    outputs = set(record.get("outputs", {}))
    blocks = []
    shown = 0
    left_out = 0
    for origin, holders in survived.items():
        data = nodes[origin]
        offsets = data["prompt_offsets"]
        colour = sketch.colour(origin)
        views = []
        for holder, entry in holders.items():
            if not entry["tokens"] and not entry["generated"]:
                continue
            if shown >= MAX_SPAN_VIEWS:
                left_out += 1
                continue
            shown += 1
            hops = ", ".join(str(hop) for hop in entry["hops"])
            extra = f", plus {entry['generated']} of its generated tokens" if entry["generated"] else ""
            opened = " open" if holder in outputs or len(holders) <= 2 or holder == next(iter(holders)) else ""
            views.append(
                f"<details{opened}><summary>in <b>{_e(holder)}</b>: {len(entry['tokens'])} of "
                f"{len(offsets)} prompt tokens (after {hops} hop{'s' if hops != '1' else ''}){extra}</summary>"
                f'<div class="prompt">{marked_prompt(data["prompt_text"], offsets, entry["tokens"], colour)}</div>'
                "</details>"
            )
        if views:
            blocks.append(
                f'<div class="spans"><h3><span class="dot" style="background:{colour}"></span>'
                f"{_e(origin)}'s prompt: what survived downstream</h3>{''.join(views)}</div>"
            )
    if not blocks:
        return ""
    note = ""
    if left_out:
        note = f'<p class="note">{left_out} more views were left out; read record.json for all of them.</p>'
    explain = (
        '<p class="note">Highlighted: prompt tokens of that node whose positions are still held by '
        "the node named in the line (after selection on every hop in between).</p>"
    )
    return f"<section><h2>Kept spans</h2>{explain}{''.join(blocks)}{note}</section>"


def _texts(record: dict[str, Any]) -> str:
    rows = []
    for name, data in record.get("nodes", {}).items():
        text = data.get("text")
        body = '<span class="note">(reads only, generated nothing)</span>' if text is None else _text(text, "its node file in nodes/")
        rows.append(f"<tr><td>{_e(name)}</td><td class='text'>{body}</td></tr>")
    if not rows:
        return ""
    return f"<section><h2>What each node generated</h2><table>{''.join(rows)}</table></section>"


def _details(record: dict[str, Any]) -> str:
    inputs = json.dumps(record.get("inputs", {}), indent=2, ensure_ascii=False)
    versions = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in record.get("versions", {}).items())
    models = "".join(
        f"<tr><td>{_e(m['name'])}</td><td>{_e(m['source'])}</td><td>{_e(m['dtype'])} / {_e(m['device'])}</td>"
        f"<td class='mono'>{_e(m.get('fingerprint') or '–')}</td></tr>"
        for m in record.get("models", [])
    )
    seeds = record.get("seeds", {})
    seed_rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in seeds.get("nodes", {}).items())
    spec = json.dumps(record.get("topology", {}).get("spec", {}), indent=2, ensure_ascii=False)
    return (
        "<section><h2>Run details</h2>"
        f"<details open><summary>Inputs</summary><pre>{_e(inputs)}</pre></details>"
        f"<details><summary>Models</summary><table><tr><th>name</th><th>source</th><th>dtype / device</th>"
        f"<th>fingerprint</th></tr>{models}</table></details>"
        f"<details><summary>Versions</summary><table>{versions}</table></details>"
        f"<details><summary>Seeds (run seed {_e(seeds.get('run'))})</summary><table>{seed_rows}</table></details>"
        f"<details><summary>Plan fingerprint</summary><p class='mono'>{_e(record.get('plan', {}).get('fingerprint'))}"
        f"</p></details><details><summary>Topology (as run)</summary><pre>{_e(spec)}</pre></details></section>"
    )


_CSS = """
:root{--ink:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa}
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--ink);
margin:0;background:#fff}
main{max-width:1180px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:30px 0 10px;padding-bottom:4px;
border-bottom:1px solid var(--line)}h3{font-size:15px;margin:16px 0 6px}
.description{color:var(--muted);margin:0 0 8px}
.facts{display:flex;flex-wrap:wrap;gap:6px 18px;color:var(--muted);font-size:13px}.facts b{color:var(--ink)}
.badge{font-size:13px;padding:2px 9px;border-radius:10px;vertical-align:middle;color:#fff;background:#59636e}
.badge.finished{background:#1a7f37}.badge.failed{background:#cf222e}.badge.cancelled{background:#9a6700}
.badge.running{background:#0969da}.badge.waiting{background:#8250df}.badge.skipped{background:#8c959f}
.waiting{margin-top:10px;padding:8px 12px;border:1px solid #c297ff;background:#fbefff;border-radius:6px}
.waiting .label{font-size:12px;color:var(--muted)}.waiting .text{white-space:pre-wrap}
tr.skipped td{color:#8c959f}.legend .grey{border-color:#c8ccd1;background:#c8ccd122}
.error{margin-top:10px;padding:8px 12px;border:1px solid #ff8182;background:#ffebe9;border-radius:6px}
.output{border:1px solid var(--line);border-left:4px solid #1a7f37;border-radius:6px;padding:10px 14px;margin:8px 0}
.output .label{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.output .text{font-size:17px;white-space:pre-wrap}
.graph{overflow-x:auto;border:1px solid var(--line);border-radius:6px;padding:8px;background:var(--soft)}
.graph svg{display:block;margin:0 auto;max-width:100%;height:auto}
.legend{display:flex;flex-wrap:wrap;gap:4px 18px;font-size:12px;color:var(--muted);margin-top:6px}
.legend i{display:inline-block;vertical-align:middle;margin-right:5px}
.legend .line{width:22px;height:0;border-top:2px solid}.legend .state{border-color:#4e79a7}
.legend .full{border-color:#b07aa1}.legend .text{border-top:2px dashed #7f7f7f}
.legend .box{width:16px;height:11px;border:1.5px solid #59636e;border-radius:3px}
.legend .dashed{border-style:dashed}.legend .bold{border-width:3px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.wide{min-width:220px}td.text{white-space:pre-wrap}
.bar{display:flex;height:10px;border-radius:3px;overflow:hidden;background:#eaeef2;margin-top:3px}
.bar span{display:block;height:100%}
.small{font-size:12px;color:var(--muted)}
.dot{display:inline-block;width:10px;height:10px;border-radius:50%;margin-right:6px}
.note{color:var(--muted);font-size:13px}
.ok{color:#1a7f37}.bad{color:#cf222e}
.spans{margin-bottom:14px}
details{margin:4px 0}summary{cursor:pointer;font-size:14px}
.prompt{white-space:pre-wrap;font:13px/1.55 ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;
background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:8px 10px;margin:4px 0 10px;
color:#8c959f}
.prompt mark{color:var(--ink);border-radius:2px;padding:0 1px}
pre{background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:8px 10px;overflow-x:auto;
font-size:12px;white-space:pre-wrap}
.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
footer{margin-top:30px;color:var(--muted);font-size:12px}
details.subgraph{border-left:3px solid var(--line);padding-left:10px;margin:10px 0}.nested{margin-left:14px}
"""


def render_report(record: dict[str, Any]) -> str:
    """The whole page as one string (no external resource of any kind)."""
    sketch = sketch_record(record)
    body = "".join(
        [
            _header(record),
            _outputs(record),
            _graph(record, sketch),
            _skipped(record),
            _hops(record, sketch),
            _lineage(record, sketch),
            subgraphs_section(record, sketch.colour),
            runtime_foreach_section(record),
            _spans(record, sketch),
            tool_calls_section(record),
            _texts(record),
            _details(record),
        ]
    )
    title = f"{record.get('graph', 'run')} · {record.get('run_id', '')}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "img-src data:\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}<footer>rclc-graph run record · record.json holds every figure on this page"
        "</footer></main></body></html>\n"
    )
