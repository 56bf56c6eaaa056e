"""One raw-text sender, one question about an entity it mentions once among distractors:
CacheBack at r2 keeps the whole fact and the receiver answers from the kept rows.

This is one fixed case, a regression check of the end-to-end path on the embedded
SmolLM2-135M. How often evidence survives across a generated set (and at r4/r8, where a
135M model's attention is much less reliable) is measured by
`benchmarks/evidence_survival.py`, not asserted here.
"""

from __future__ import annotations

import pytest
import torch

from rclc import HFReceiver, sender_from_hf, transfer_sync
from rclc_graph.experiments.evidence_tokens import evidence_positions

pytestmark = pytest.mark.integration

EVIDENCE = "The Heron project is owned by Priya Ferreira."
DOCUMENT = " ".join(
    [
        "The weather that season was mild and mostly dry.",
        "The Otter project is owned by Tariq Rossi.",
        "The Lynx project was founded in 1987.",
        "Local newspapers covered the regional elections in detail.",
        EVIDENCE,
        "The Falcon project is based in Tallinn.",
        "A community garden was planted behind the public library.",
        "The Badger project is owned by Sven Larsen.",
        "The city council approved repairs to an old bridge.",
        "The Kestrel project was founded in 2004.",
        "Prices for coffee rose slightly over the year.",
        "The Marten project is owned by Hana Costa.",
    ]
)
QUESTION = "Who owns the Heron project?"
ANSWER = "Priya Ferreira"


def test_cacheback_r2_keeps_the_fact_and_the_receiver_answers(embedded):
    model, tokenizer = embedded
    sender = sender_from_hf(model, tokenizer, DOCUMENT)
    evidence = evidence_positions(tokenizer, DOCUMENT, EVIDENCE)
    # The fact sits in the first half, so keeping the most recent half would lose it.
    assert evidence[-1] < sender.positions // 2
    receiver = HFReceiver(
        model, tokenizer, messages=[{"role": "system", "content": "Answer from the context you were given."}],
        max_new_tokens=16,
    )
    transfer_sync(sender, receiver, QUESTION, ratio=2, record_selection=True)

    delivery, _ = receiver.peek(0)
    selection = delivery.messages[0].selection
    kept = set(selection.indices)
    assert len(kept) == (sender.positions + 1) // 2
    missing = [position for position in evidence if position not in kept]
    assert not missing, tokenizer.decode(sender.token_ids[missing])

    inputs = receiver.pop()
    with torch.no_grad():
        tokens = model.generate(**inputs, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    reply = tokenizer.decode(tokens[0], skip_special_tokens=True)
    assert ANSWER in reply, reply


def test_evidence_positions_cover_exactly_the_fact(embedded):
    _, tokenizer = embedded
    positions = evidence_positions(tokenizer, DOCUMENT, EVIDENCE)
    ids = tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"]
    assert positions == list(range(positions[0], positions[-1] + 1))
    assert tokenizer.decode([ids[i] for i in positions]).strip() == EVIDENCE
    assert tokenizer.decode(ids[positions[0] - 1 : positions[0]]) == "."
    assert tokenizer.decode(ids[positions[-1] + 1 : positions[-1] + 2]) == " The"
