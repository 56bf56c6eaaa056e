"""Family `profiles` (and the documents of `paraphrase`): documents that each describe a few
organisations, each with several facts of relations they share.

What it tests: the sentence to keep is the one naming *both* the asked organisation and the
asked relation. The asked organisation has other facts beside it (its head, its city, its
founding year, ...), other organisations in the same document have the asked relation, and
in half of the cases another document mentions the asked organisation too, with a
different relation. A selector that finds the organisation's name, or the relation's word,
finds distractors as readily as the evidence.

Why real corpora have it: encyclopaedia entries, company registers, news and reports
describe an entity with several attributes at once, and describe several entities of one
kind side by side; entities recur across documents.

Each organisation's facts stay together as one run of sentences (one or two facts per
sentence: "The Cedar lab is based in Oslo and was founded in 1982."), runs and neutral
filler sentences shuffled; each fact is worded with one of the relation's statements.
"""

from __future__ import annotations

import random
from typing import Callable

from .drafts import Draft
from .facts import Fact, Subject, Values, answers_for, fill, joined, relation, sentence
from .relations import ORG_RELATIONS
from .vocabulary import filler_sentence

JOIN_CHANCE = 0.35
"""How often two facts of an organisation share one sentence."""
MENTION_CHANCE = 0.5
"""How often another document also mentions the asked organisation (another relation)."""


def render_run(facts: list[Fact], rng: random.Random, evidence_of: Fact | None = None,
               wording: Callable[[Fact, str], bool] | None = None) -> tuple[list[str], str | None]:
    """One subject's facts as a run of sentences (one or two facts each), and the sentence
    holding `evidence_of` (None when it is not among `facts`). `wording(fact, sentence)`,
    when given, must accept the evidence sentence; other wordings are drawn until it does."""
    order = list(facts)
    rng.shuffle(order)
    sentences, evidence = [], None
    while order:
        pair = len(order) >= 2 and rng.random() < JOIN_CHANCE
        group, order = (order[:2], order[2:]) if pair else (order[:1], order[1:])
        for _ in range(200):
            text = joined(group[0], group[1], rng) if pair else sentence(group[0], rng)
            if evidence_of not in group or wording is None or wording(evidence_of, text):
                break
            if pair and rng.random() < 0.5:  # a sentence of its own is easier to word apart
                pair, order = False, group[1:] + order
                group = group[:1]
        else:
            raise AssertionError("no wording of the evidence passed the check")
        if evidence_of in group:
            evidence = text
        sentences.append(text)
    return sentences, evidence


def profile_case(rng: random.Random, documents: int, *, facts: tuple[int, int], question: Callable[[Fact, str], str | None]) -> Draft:
    """A profiles-shaped case: `facts` (low, high) facts per organisation; `question(asked
    fact, evidence sentence)` words the question (None: this evidence wording does not suit
    it, draw another)."""
    values = Values(rng)
    draft = Draft([[] for _ in range(documents)])
    gold = rng.randrange(documents)
    names = list(ORG_RELATIONS)
    asked_relation = rng.choice(names)
    runs: list[tuple[int, Subject, list[str]]] = []
    for document in range(documents):
        for number in range(rng.randint(2, 3)):
            subject = values.org()
            count = rng.randint(*facts)
            asked_here = document == gold and number < 2  # the asked organisation and one rival
            chosen = [asked_relation] if asked_here else []
            chosen += rng.sample([name for name in names if name not in chosen], count - len(chosen))
            runs.append((document, subject, chosen))
    asked_subject = runs[[index for index, run in enumerate(runs) if run[0] == gold][0]][1]
    asked_relations = next(chosen for _, subject, chosen in runs if subject == asked_subject)
    left = [name for name in names if name not in asked_relations]
    if documents > 1 and left and rng.random() < MENTION_CHANCE:
        other = rng.choice([d for d in range(documents) if d != gold])
        runs.append((other, asked_subject, [rng.choice(left)]))
    asked_fact, worded = None, {}

    def accept(fact: Fact, text: str) -> bool:
        worded["question"] = question(fact, text)
        return worded["question"] is not None

    for document, subject, chosen in runs:
        run_facts = [Fact(subject, relation(name), values.value(relation(name).value)) for name in chosen]
        target = next((f for f in run_facts if subject == asked_subject and f.relation.name == asked_relation
                       and document == gold), None)
        text, evidence = render_run(run_facts, rng, target, accept if target else None)
        draft.add(document, *text)
        draft.state(document, run_facts)
        if target is not None:
            asked_fact, draft.evidence = target, [(document, evidence)]
    assert asked_fact is not None
    for document in range(documents):
        for _ in range(rng.randint(1, 3)):
            draft.add(document, filler_sentence(rng))
    draft.question = worded["question"]
    draft.answers = answers_for(asked_fact.relation.value, asked_fact.value)
    draft.meta = {"relation": asked_relation, "entity": asked_subject.phrase}
    return draft


def draw_profiles(rng: random.Random, documents: int) -> Draft:
    """A `profiles` case: 2 to 4 facts per organisation, a plain question."""

    def plain(fact: Fact, _evidence: str) -> str:
        return fill(rng.choice(fact.relation.questions), fact.subject)

    return profile_case(rng, documents, facts=(2, 4), question=plain)
