"""A seeded synthetic multi-document fact dataset for demos, tests and measurements.

Each case asks about one entity. Exactly one document (the gold one) states the asked
fact, once; every document also carries facts about *other* entities with the same
relations (so a selector must use the question, not the relation word) and neutral
filler sentences. Nothing here is tuned to favour any handoff policy: entity, relation
and sentence order are drawn uniformly from the seed.
"""

from __future__ import annotations

import os
import random

from .datasets import Case, write_jsonl

ENTITIES = [
    "Cedar", "Birch", "Maple", "Willow", "Aspen", "Juniper", "Hazel", "Alder", "Rowan", "Laurel",
    "Spruce", "Poplar", "Linden", "Sequoia", "Magnolia", "Cypress", "Hawthorn", "Sycamore", "Acacia", "Elm",
    "Orchid", "Falcon", "Heron", "Otter", "Badger", "Lynx", "Marten", "Osprey", "Kestrel", "Puffin",
]
FIRST = ["Alice", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ivan", "Jonas",
         "Kira", "Luis", "Mira", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tariq"]
LAST = ["Moreno", "Okafor", "Lindqvist", "Tanaka", "Novak", "Haddad", "Ferreira", "Kowalski", "Nguyen", "Byrne",
        "Adeyemi", "Rossi", "Petrov", "Sato", "Duarte", "Mensah", "Larsen", "Ibrahim", "Costa", "Weber"]
CITIES = ["Oslo", "Lima", "Nairobi", "Hanoi", "Porto", "Quito", "Tallinn", "Accra", "Kyoto", "Dakar",
          "Bergen", "Cusco", "Mombasa", "Hue", "Braga", "Cuenca", "Tartu", "Kumasi", "Nara", "Thies"]
FILLER = [
    "The weather that season was mild and mostly dry.",
    "Several committees met in the spring to review budgets.",
    "Local newspapers covered the regional elections in detail.",
    "A new railway line opened between two northern towns.",
    "The annual report listed no unusual expenses.",
    "Most employees worked from the main office on weekdays.",
    "The museum extended its opening hours during the summer.",
    "Traffic on the coastal road increased after the holidays.",
    "A community garden was planted behind the public library.",
    "The city council approved repairs to an old bridge.",
    "Prices for coffee rose slightly over the year.",
    "Volunteers organised a cleanup of the river banks.",
]

RELATIONS: dict[str, dict[str, str]] = {
    "owner": {"fact": "The {entity} project is owned by {value}.", "question": "Who owns the {entity} project?"},
    "city": {"fact": "The {entity} project is based in {value}.", "question": "In which city is the {entity} project based?"},
    "year": {"fact": "The {entity} project was founded in {value}.", "question": "In which year was the {entity} project founded?"},
}


def _value(rng: random.Random, relation: str) -> str:
    if relation == "owner":
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    if relation == "city":
        return rng.choice(CITIES)
    return str(rng.randint(1950, 2023))


def draw_case(rng: random.Random, index: int, *, documents: int, facts_per_document: int, filler_per_document: int) -> Case:
    entities = rng.sample(ENTITIES, documents * facts_per_document)
    asked_entity = entities[0]
    relation = rng.choice(sorted(RELATIONS))
    answer = _value(rng, relation)
    evidence = RELATIONS[relation]["fact"].format(entity=asked_entity, value=answer)
    gold = rng.randrange(documents)
    others = iter(entities[1:])
    docs = []
    for d in range(documents):
        sentences = rng.sample(FILLER, filler_per_document)
        count = facts_per_document - 1 if d == gold else facts_per_document
        for _ in range(count):
            other_relation = rng.choice(sorted(RELATIONS))
            sentences.append(
                RELATIONS[other_relation]["fact"].format(entity=next(others), value=_value(rng, other_relation))
            )
        if d == gold:
            sentences.append(evidence)
        rng.shuffle(sentences)
        docs.append(" ".join(sentences))
    question = RELATIONS[relation]["question"].format(entity=asked_entity)
    return Case(
        f"syn-{index:05d}", tuple(docs), question, (answer,), gold, evidence, {"relation": relation, "entity": asked_entity}
    )


def make_dataset(
    size: int,
    *,
    seed: int = 0,
    documents: int = 3,
    facts_per_document: int = 4,
    filler_per_document: int = 4,
) -> list[Case]:
    """`size` cases drawn from `seed` (same seed, same cases, on every machine)."""
    for name, value, least in (("size", size, 1), ("seed", seed, 0), ("documents", documents, 1),
                               ("facts_per_document", facts_per_document, 1), ("filler_per_document", filler_per_document, 0)):
        if type(value) is not int or value < least:
            raise ValueError(f"{name}: expected a whole number >= {least}, got {value!r}")
    if filler_per_document > len(FILLER):
        raise ValueError(f"filler_per_document: at most {len(FILLER)} distinct filler sentences exist")
    if documents * facts_per_document > len(ENTITIES):
        raise ValueError(
            f"documents x facts_per_document: at most {len(ENTITIES)} distinct entities exist; lower one of them"
        )
    rng = random.Random(seed)
    return [
        draw_case(rng, i, documents=documents, facts_per_document=facts_per_document, filler_per_document=filler_per_document)
        for i in range(size)
    ]


def write_dataset(
    path: str | os.PathLike[str],
    size: int,
    *,
    seed: int = 0,
    documents: int = 3,
    facts_per_document: int = 4,
    filler_per_document: int = 4,
) -> int:
    """Generate `size` cases and write them as JSONL (what `rclc-graph data make` does)."""
    cases = make_dataset(
        size, seed=seed, documents=documents, facts_per_document=facts_per_document, filler_per_document=filler_per_document
    )
    return write_jsonl(path, cases)
