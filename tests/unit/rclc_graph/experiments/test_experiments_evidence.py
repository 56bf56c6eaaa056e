"""Evidence positions: the tokens overlapping a fact's characters, checked against the tokenizer."""

from __future__ import annotations

import pytest

from rclc_graph.experiments.evidence_tokens import evidence_positions, locate_evidence
from rclc_graph.experiments.synthetic import make_dataset

TEXT = "Filler text here. The Cedar project is owned by Alice. More filler follows."
FACT = "The Cedar project is owned by Alice."


def test_positions_decode_to_the_fact(tiny_tokenizer):
    positions = evidence_positions(tiny_tokenizer, TEXT, FACT)
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert positions == list(range(positions[0], positions[-1] + 1))
    decoded = tiny_tokenizer.decode([ids[i] for i in positions])
    assert FACT in decoded
    # Only the fact's tokens: the neighbours on each side lie outside its characters.
    offsets = tiny_tokenizer(TEXT, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    start, stop = locate_evidence(TEXT, FACT)
    if positions[0] > 0:
        assert offsets[positions[0] - 1][1] <= start
    if positions[-1] + 1 < len(ids):
        assert offsets[positions[-1] + 1][0] >= stop


def test_every_generated_case_locates_its_evidence(tiny_tokenizer):
    for case in make_dataset(20, seed=3, documents=1, facts_per_document=5, filler_per_document=5):
        document = case.documents[case.gold_document]
        positions = evidence_positions(tiny_tokenizer, document, case.evidence)
        ids = tiny_tokenizer(document, add_special_tokens=False)["input_ids"]
        assert case.evidence in tiny_tokenizer.decode([ids[i] for i in positions])


def test_fact_at_the_start_and_the_end(tiny_tokenizer):
    assert evidence_positions(tiny_tokenizer, FACT + " Tail.", FACT)[0] == 0
    text = "Head. " + FACT
    count = len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    assert evidence_positions(tiny_tokenizer, text, FACT)[-1] == count - 1


@pytest.mark.parametrize(
    ("text", "evidence", "message"),
    [
        (TEXT, "The Birch project is owned by Bob.", "not found"),
        (TEXT + " " + FACT, FACT, "more than once"),
        (TEXT, "  ", "non-empty"),
    ],
)
def test_unlocatable_evidence_is_refused(tiny_tokenizer, text, evidence, message):
    with pytest.raises(ValueError, match=message):
        evidence_positions(tiny_tokenizer, text, evidence)


def test_slow_tokenizer_is_refused():
    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="fast tokenizer"):
        evidence_positions(Slow(), TEXT, FACT)
