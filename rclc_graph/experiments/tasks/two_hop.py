"""Family `two-hop`: the answer needs two facts from two different documents.

One document says who owns (or heads) an organisation, another where that person lives,
studied, or when they were born; the question asks through the first fact: "In which city
does the owner of the Cedar lab live?". Neither fact answers alone: the first does not hold
the answer, the second does not name the organisation.

What it tests: whether a handoff keeps a fact its request names only indirectly (the
person's sentence shares no name with the question), beside the one it names. Distractors
make each hop ambiguous on its own: other organisations owned or headed by other people,
whose homes, studies and birth years are stated too; in half of the cases the asked
organisation also has the other kind of person (its head when the owner is asked), with the
asked attribute stated for them; in half, the asked person has another attribute of the
same kind of value (where they studied, when their home is asked), and the organisation's
own city or founding year is stated (a city or year that is not the answer).

Why real corpora have it: facts about one thing are spread over documents that each
describe something else (a company register names the owner; a biography says where the
owner lives); multi-hop questions over such documents are a standard benchmark shape
(HotpotQA, 2WikiMultiHopQA, MuSiQue).
"""

from __future__ import annotations

import random

from .drafts import Draft, spread
from .facts import Fact, Subject, Values, answers_for, fill, relation, sentence
from .relations import BRIDGES, PERSON_RELATIONS
from .vocabulary import filler_sentence

TRAP_CHANCE = 0.5
"""How often each same-kind trap (module docstring) is placed."""
_SAME_KIND = {"home": "studied", "studied": "home", "born": None}
_ORG_TRAP = {"city": "city", "year": "founded"}


def draw_two_hop(rng: random.Random, documents: int) -> Draft:
    """A `two-hop` case over `documents` (>= 2) documents (module docstring)."""
    values = Values(rng)
    draft = Draft([[] for _ in range(documents)])
    bridge, target = relation(rng.choice(BRIDGES)), relation(rng.choice(list(PERSON_RELATIONS)))
    organisation, person = values.org(), Subject(values.person())
    first = Fact(organisation, bridge, person.name)
    second = Fact(person, target, values.value(target.value))
    near, far = rng.sample(range(documents), 2)
    draft.evidence = [(near, sentence(first, rng)), (far, sentence(second, rng))]
    draft.add(near, draft.evidence[0][1])
    draft.add(far, draft.evidence[1][1])
    draft.state(near, [first])
    draft.state(far, [second])
    others: list[Fact] = []
    other_bridge = relation(next(name for name in BRIDGES if name != bridge.name))
    if rng.random() < TRAP_CHANCE:  # the organisation's other person, with the asked attribute
        rival = Subject(values.person())
        others += [Fact(organisation, other_bridge, rival.name), Fact(rival, target, values.value(target.value))]
    same_kind = _SAME_KIND[target.name]
    if same_kind is not None and rng.random() < TRAP_CHANCE:  # the person's other city
        others.append(Fact(person, relation(same_kind), values.value(target.value)))
    if rng.random() < TRAP_CHANCE:  # the organisation's own city or year
        own = relation(_ORG_TRAP.get(target.value, "city"))
        others.append(Fact(organisation, own, values.value(own.value)))
    for _ in range(documents + rng.randint(0, 2)):  # other organisations and their people
        company, someone = values.org(), Subject(values.person())
        link = relation(rng.choice(BRIDGES))
        others.append(Fact(company, link, someone.name))
        for name in PERSON_RELATIONS:
            if name == target.name and rng.random() < 0.8 or name != target.name and rng.random() < 0.3:
                attribute = relation(name)
                others.append(Fact(someone, attribute, values.value(attribute.value)))
    for fact, document in zip(others, spread(rng, documents, len(others))):
        draft.add(document, sentence(fact, rng))
        draft.state(document, [fact])
    for document in range(documents):
        for _ in range(rng.randint(1, 2)):
            draft.add(document, filler_sentence(rng))
    role = fill(rng.choice(bridge.roles), organisation)
    draft.question = fill(rng.choice(target.questions), role)
    draft.answers = answers_for(target.value, second.value)
    draft.meta = {"relation": f"{bridge.name}>{target.name}", "entity": organisation.phrase, "bridge": person.name}
    return draft
