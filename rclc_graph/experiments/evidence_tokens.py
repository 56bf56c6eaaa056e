"""Where a case's evidence sentence sits in a sender's token positions.

Measurements of "did the handoff keep the fact?" need the fact's positions in the state
the selector saw. A sender built from raw document text (`sender_from_hf(model,
tokenizer, text)`) holds exactly `tokenizer(text, add_special_tokens=False)` tokens, so
the fast tokenizer's character offsets map the evidence's character span onto positions.
A token counts as evidence when its character span overlaps the evidence's: BPE tokens
carry their leading space (" The" starts one character early), and a token straddling
the evidence edge is needed to read the evidence, so overlap (not containment) is the
honest test.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError


def locate_evidence(text: str, evidence: str) -> tuple[int, int]:
    """Character span `[start, stop)` of the single occurrence of `evidence` in `text`."""
    if not isinstance(text, str) or not isinstance(evidence, str):
        raise UsageError("text, evidence: expected strings")
    if not evidence.strip():
        raise UsageError("evidence: expected a non-empty string to locate in the text")
    start = text.find(evidence)
    if start < 0:
        raise UsageError("evidence: not found in the text; pass the exact sentence as it appears in the document")
    if text.find(evidence, start + 1) >= 0:
        raise UsageError("evidence: occurs more than once in the text; its positions would be ambiguous")
    return start, start + len(evidence)


def evidence_positions(tokenizer: Any, text: str, evidence: str) -> list[int]:
    """Ascending token positions (of `tokenizer(text, add_special_tokens=False)`) that
    overlap the single occurrence of `evidence` in `text`.

    Needs a fast tokenizer (one that returns offset mappings).
    """
    start, stop = locate_evidence(text, evidence)
    if not getattr(tokenizer, "is_fast", False):
        raise UsageError("tokenizer: evidence positions need a fast tokenizer (offset mappings); load it with use_fast=True")
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    positions = [index for index, (first, last) in enumerate(offsets) if first < stop and last > start]
    if not positions:
        raise UsageError("evidence: no token overlaps it (the tokenizer returned empty offsets)")
    return positions
