"""Recorded selections as a standalone HTML page, with kept spans highlighted.

Every string that reaches the page (request, decoded model text) is HTML-escaped: the
text comes from documents and models, never from us, and may contain markup.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import torch

from .selection import Selection

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; max-width: 60rem; }
pre.body { white-space: pre-wrap; word-wrap: break-word; background: #fafafa; padding: 1rem;
           border: 1px solid #ddd; line-height: 1.5; }
mark.kept { background: #b7f0b1; text-decoration: underline; }
span.omitted { color: #666; }
.excluded { text-decoration: line-through; text-decoration-color: #999; }
.placeholder { font-style: italic; }
"""


def _request_label(request: Any) -> str:
    if isinstance(request, torch.Tensor):
        return f"[supplied token IDs: {request.shape[-1]} tokens]"
    return str(request)


def selection_section(index: int, selection: Selection) -> str:
    """One sender's selection: a heading with the counts, then its text with kept spans marked."""
    kept = len(selection.indices)
    heading = (
        f"Sender {index}: {kept} / {selection.source_positions} source positions kept; budget {selection.budget}"
    )
    if selection.allocation == "pooled":
        heading += f" (pooled; its own fitted count was {selection.cap})"
    if selection.added_latent_positions:
        heading += f"; {selection.added_latent_positions} latent positions added after selection"
    excluded = selection.excluded
    if excluded:
        heading += "; passed over: " + ", ".join(f"{count} {reason}" for reason, count in excluded.items())
    pieces = []
    for span in selection.spans:
        label = "kept" if span.kept else "omitted"
        title = f"{label}: positions [{span.start}, {span.stop})"
        if span.excluded is not None:
            title += f", passed over ({span.excluded})"
        if span.kind == "token" and span.text is not None:
            body = html.escape(span.text)
        else:
            body = f'<span class="placeholder">[{span.kind}: {span.stop - span.start} positions]</span>'
        tag = "mark" if span.kept else "span"
        css = ("kept" if span.kept else "omitted") + (" excluded" if span.excluded is not None else "")
        pieces.append(f'<{tag} class="{css}" title="{html.escape(title)}">{body}</{tag}>')
    return f"<h2>{html.escape(heading)}</h2>\n<pre class=\"body\">{''.join(pieces)}</pre>"


def selection_page(request: Any, selections: Sequence[Selection]) -> str:
    """A standalone page (no external assets) for one request and its senders' selections."""
    sections = "\n".join(selection_section(i, s) for i, s in enumerate(selections))
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>rclc transfer selection</title>"
        f"<style>{_STYLE}</style></head><body>\n<h1>Transfer selection</h1>\n"
        f"<p><strong>Request:</strong> {html.escape(_request_label(request))}</p>\n{sections}\n</body></html>\n"
    )
