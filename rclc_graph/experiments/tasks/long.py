"""Family `long`: the other families' cases with long documents.

Each case draws its base family uniformly (single-fact, profiles, paraphrase, two-hop),
builds that case, then fills every document towards a length drawn from `tokens` (word
pieces: words and punctuation marks) with neutral sentences inserted at random places
between its sentences, and splits it into paragraphs of 3 to 6 sentences. The facts, the
question and the evidence are the base case's, unchanged.

What it tests: whether selection still finds the evidence when it is a small part of each
sender's state (a sentence among 300 to 600 word pieces) and the budget is larger in
absolute terms, so that markup and the question copy no longer crowd the evidence out,
but many more neutral sentences compete with it.

Why real corpora have it: evidence is rarely the bulk of a document; reports, articles and
manuals state a fact once among paragraphs about other things.
"""

from __future__ import annotations

import random
import re

from .. import synthetic
from ..datasets import Case, make_case
from .vocabulary import filler_sentence

BASES = ("single-fact", "profiles", "paraphrase", "two-hop")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")


def lengthen(case: Case, rng: random.Random, tokens: tuple[int, int]) -> Case:
    """`case` with every document filled towards a drawn length (module docstring)."""
    documents = []
    for document in case.documents:
        sentences = _SENTENCE_END.split(document)
        target = rng.randint(*tokens)
        length = sum(synthetic.pieces(text) for text in sentences)
        while True:
            filler = filler_sentence(rng)
            if length + synthetic.pieces(filler) > target:
                break
            sentences.insert(rng.randint(0, len(sentences)), filler)
            length += synthetic.pieces(filler)
        paragraphs, start = [], 0
        while start < len(sentences):
            stop = start + rng.randint(3, 6)
            paragraphs.append(" ".join(sentences[start:stop]))
            start = stop
        documents.append("\n\n".join(paragraphs))
    return make_case(id=case.id, documents=documents, question=case.question, answers=case.answers,
                     gold_document=case.gold_document, evidence=case.evidence, meta=case.meta)
