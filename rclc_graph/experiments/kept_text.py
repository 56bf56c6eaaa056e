"""What text the answering node received over state and full hops, read from lineage.

A results row keeps it (`kept`) so that a wrong answer can be explained without rerunning:
which of the senders' sentences reached the answerer, and what else was kept beside them.
Each run of consecutive positions from one origin node's prompt becomes one piece of text
(the characters its tokens cover in that node's rendered prompt, chat markup included);
generated tokens and continuous rows, which have no prompt text, are summarised by count.
"""

from __future__ import annotations

from typing import Mapping

from .evidence import NodeLike


def kept_text(nodes: Mapping[str, NodeLike], output: str) -> list[list[str]] | None:
    """[origin node, text] per run of received positions, in the answering node's order;
    None when the output node did not finish."""
    node = nodes.get(output)
    if node is None:
        return None
    pieces: list[list[str]] = []
    for segment in node.lineage.segments:
        if segment.node == output:
            continue
        origin = nodes.get(segment.node)
        if segment.kind != "prompt" or origin is None:
            pieces.append([segment.node, f"<{segment.length} {segment.kind} rows>"])
            continue
        first = segment.start - origin.prompt_start
        spans = [origin.prompt_offsets[index] for index in range(max(first, 0), first + segment.length)
                 if 0 <= index < len(origin.prompt_offsets)]
        spans = [span for span in spans if span[1] > span[0]]
        if not spans:
            pieces.append([segment.node, f"<{segment.length} markup rows>"])
            continue
        pieces.append([segment.node, origin.prompt_text[spans[0][0]:spans[-1][1]]])
    return pieces


