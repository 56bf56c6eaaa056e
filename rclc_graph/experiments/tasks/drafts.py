"""A case under construction: documents as lists of sentence units, then a checked `Case`.

Families place units (a fact sentence, an entity's run of sentences, a filler sentence) into
documents and record which sentence holds each fact the answer needs; `to_case` shuffles
the units of every document (an entity's run stays together), joins them and checks what
every family promises: each evidence sentence occurs exactly once in the whole case, inside
its gold document, and no accepted answer occurs anywhere but in the evidence.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from ..datasets import Case, make_case
from ..scoring import normalise


@dataclass
class Draft:
    """Documents as lists of units (each unit a list of sentences kept in order)."""

    documents: list[list[list[str]]]
    question: str = ""
    answers: tuple[str, ...] = ()
    evidence: list[tuple[int, str]] = field(default_factory=list)  # (document index, sentence) per needed fact
    meta: dict[str, Any] = field(default_factory=dict)
    facts: list[tuple[str, str, str, int]] = field(default_factory=list)  # (subject, relation, value, document)

    def add(self, document: int, *sentences: str) -> None:
        """One unit (sentences kept together, in this order) in `document`."""
        self.documents[document].append(list(sentences))

    def state(self, document: int, facts: Any) -> None:
        """Record facts (anything with `subject.name`, `relation.name` and `value`) stated in
        `document`: `meta["facts"]` lists them, for tests and for failure analysis (which
        other fact did a wrong answer name?)."""
        self.facts.extend((fact.subject.name, fact.relation.name, fact.value, document) for fact in facts)

    def to_case(self, case_id: str, rng: random.Random) -> Case:
        """The units of each document shuffled and joined (module docstring); AssertionError
        when a family broke its promises (a bug in the generator, never in the data)."""
        texts = []
        for units in self.documents:
            order = list(units)
            rng.shuffle(order)
            texts.append(" ".join(sentence for unit in order for sentence in unit))
        self.check(texts)
        gold: Any = self.evidence[0][0] if len(self.evidence) == 1 else tuple(index for index, _ in self.evidence)
        sentences: Any = self.evidence[0][1] if len(self.evidence) == 1 else tuple(text for _, text in self.evidence)
        meta = {**self.meta, "facts": [list(fact) for fact in self.facts]}
        return make_case(id=case_id, documents=texts, question=self.question, answers=self.answers,
                         gold_document=gold, evidence=sentences, meta=meta)

    def check(self, texts: list[str]) -> None:
        joined = "\n".join(texts)
        for document, sentence in self.evidence:
            if joined.count(sentence) != 1 or sentence not in texts[document]:
                raise AssertionError(f"evidence {sentence!r} must occur once, in document {document}")
        evidence_words = " ".join(normalise(sentence) for _, sentence in self.evidence)
        if not re.search(rf"\b{re.escape(normalise(self.answers[0]))}\b", evidence_words):
            raise AssertionError(f"answer {self.answers[0]!r} is in no evidence sentence")
        for answer in self.answers:
            word = rf"\b{re.escape(normalise(answer))}\b"
            outside = normalise(joined)
            for _, sentence in self.evidence:
                outside = outside.replace(normalise(sentence), " ")
            if re.search(word, outside) or re.search(word, normalise(self.question)):
                raise AssertionError(f"answer {answer!r} occurs outside the evidence")


def spread(rng: random.Random, documents: int, count: int) -> list[int]:
    """`count` document indices, every document at least once when `count >= documents`."""
    indices = list(range(documents)) * (count // documents) + rng.sample(range(documents), count % documents)
    rng.shuffle(indices)
    return indices
