"""A seeded synthetic multi-document fact dataset for demos, tests and measurements.

Each case asks about one entity. Exactly one document (the gold one) states the asked
fact, once; every document also carries facts about *other* entities with the same
relations (so a selector must use the question, not the relation word) and neutral
filler sentences. Nothing here is tuned to favour any handoff policy: entity, relation
and sentence order are drawn uniformly from the seed.

Long documents (`document_tokens=(low, high)`): each document is filled towards a length
drawn uniformly from that range (stopping before the sentence that would pass it, so up to
one filler sentence, at most 20 pieces, short of it) with neutral sentences composed from
parts (thousands of combinations, so long documents do not repeat themselves), split into
paragraphs of 3 to 6 sentences; `documents=(low, high)` draws the number of documents per case. Lengths are
counted in word pieces (words and punctuation marks), which tokenizers turn into slightly
more tokens (the embedded SmolLM2 tokenizer: 1.0 to 1.15 per piece on this text). The
default short form is unchanged: the same seed gives the same cases as before.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from typing import Any

from .datasets import Case, write_jsonl
from ..errors import UsageError

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

# Only long-document cases draw from these too (more documents need more distinct entities);
# the short form samples ENTITIES alone, so its seeds give the cases they always gave.
MORE_ENTITIES = [
    "Quartz", "Basalt", "Granite", "Marble", "Cobalt", "Amber", "Jasper", "Garnet", "Onyx", "Opal",
    "Comet", "Nebula", "Meteor", "Aurora", "Zephyr", "Monsoon", "Glacier", "Canyon", "Delta", "Fjord",
    "Lantern", "Compass", "Anchor", "Beacon", "Harbor", "Meadow", "Orchard", "Prairie", "Summit", "Valley",
]
FILLER_SUBJECTS = [
    "The regional council", "A local school", "The harbour authority", "The public library", "A small bakery",
    "The hospital board", "The football club", "A group of students", "The water company", "The city museum",
    "A neighbourhood association", "The bus operator", "The university choir", "A local farmer", "The fire brigade",
    "The weather service", "A travel agency", "The post office", "The chess club", "A film society",
]
FILLER_VERBS = [
    "published a short report on", "held a meeting about", "announced new plans for", "asked residents about",
    "reviewed the costs of", "organised a workshop on", "postponed a decision on", "received complaints about",
    "celebrated the results of", "discussed the future of", "collected donations for", "prepared a survey about",
]
FILLER_OBJECTS = [
    "the spring festival", "street lighting", "the opening hours", "road repairs", "the summer timetable",
    "waste collection", "the new playground", "parking fees", "the river path", "school lunches",
    "the winter market", "public transport", "the old town hall", "cycling lanes", "the annual fair", "local recycling",
]
FILLER_TAILS = [
    "last month", "in the autumn", "after a long debate", "during the holidays", "earlier this year",
    "at the weekend", "without much attention", "with broad support", "for the third time", "before the deadline", "",
]
_PIECE = re.compile(r"\w+|[^\w\s]")

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
    asked_entity, relation, answer, evidence, gold = _asked(rng, entities[0], documents)
    others = iter(entities[1:])
    docs = []
    for d in range(documents):
        sentences = rng.sample(FILLER, filler_per_document)
        sentences += _other_facts(rng, others, facts_per_document - 1 if d == gold else facts_per_document)
        if d == gold:
            sentences.append(evidence)
        rng.shuffle(sentences)
        docs.append(" ".join(sentences))
    question = RELATIONS[relation]["question"].format(entity=asked_entity)
    return Case(
        f"syn-{index:05d}", tuple(docs), question, (answer,), gold, evidence, {"relation": relation, "entity": asked_entity}
    )


def _asked(rng: random.Random, entity: str, documents: int) -> tuple[str, str, str, str, int]:
    """The fact a case asks about: its entity, relation, answer, evidence sentence, and the
    document (of `documents`) that holds it."""
    relation = rng.choice(sorted(RELATIONS))
    answer = _value(rng, relation)
    evidence = RELATIONS[relation]["fact"].format(entity=entity, value=answer)
    return entity, relation, answer, evidence, rng.randrange(documents)


def _other_facts(rng: random.Random, entities: Iterator[str], count: int) -> list[str]:
    """`count` distractor facts about the next entities, each of a random relation."""
    facts = []
    for _ in range(count):
        relation = rng.choice(sorted(RELATIONS))
        facts.append(RELATIONS[relation]["fact"].format(entity=next(entities), value=_value(rng, relation)))
    return facts


def filler_sentence(rng: random.Random) -> str:
    """One neutral sentence composed from parts (no project, person, city or year in it)."""
    tail = rng.choice(FILLER_TAILS)
    return f"{rng.choice(FILLER_SUBJECTS)} {rng.choice(FILLER_VERBS)} {rng.choice(FILLER_OBJECTS)}{' ' + tail if tail else ''}."


def pieces(text: str) -> int:
    """Word pieces (words and punctuation marks): the length unit of long documents."""
    return len(_PIECE.findall(text))


def _paragraphs(rng: random.Random, sentences: list[str]) -> str:
    """Sentences joined into paragraphs of 3 to 6 sentences, separated by blank lines."""
    paragraphs, start = [], 0
    while start < len(sentences):
        stop = start + rng.randint(3, 6)
        paragraphs.append(" ".join(sentences[start:stop]))
        start = stop
    return "\n\n".join(paragraphs)


def draw_long_case(
    rng: random.Random, index: int, *, documents: tuple[int, int], facts_per_document: int, tokens: tuple[int, int]
) -> Case:
    """A case whose documents are filled to `tokens` word pieces each (see the module docstring)."""
    count = rng.randint(*documents)
    entities = rng.sample(ENTITIES + MORE_ENTITIES, count * facts_per_document)
    asked_entity, relation, answer, evidence, gold = _asked(rng, entities[0], count)
    others = iter(entities[1:])
    docs = []
    for d in range(count):
        facts = _other_facts(rng, others, facts_per_document - 1 if d == gold else facts_per_document)
        if d == gold:
            facts.append(evidence)
        target = rng.randint(*tokens)
        length = sum(pieces(fact) for fact in facts)
        sentences = list(facts)
        while True:
            filler = filler_sentence(rng)
            if length + pieces(filler) > target:
                break
            sentences.append(filler)
            length += pieces(filler)
        rng.shuffle(sentences)
        docs.append(_paragraphs(rng, sentences))
    question = RELATIONS[relation]["question"].format(entity=asked_entity)
    return Case(
        f"syn-{index:05d}", tuple(docs), question, (answer,), gold, evidence,
        {"relation": relation, "entity": asked_entity, "documents": count},
    )


def _span(name: str, value: int | tuple[int, int], least: int) -> tuple[int, int]:
    """A whole number or a (low, high) range, checked."""
    low, high = (value, value) if type(value) is int else tuple(value) if isinstance(value, (tuple, list)) else (None, None)
    if type(low) is not int or type(high) is not int or low < least or high < low:
        raise UsageError(f"{name}: expected a whole number >= {least} or a range LOW-HIGH with {least} <= LOW <= HIGH, got {value!r}")
    return low, high


def make_dataset(
    size: int,
    *,
    seed: int = 0,
    documents: int | tuple[int, int] = 3,
    facts_per_document: int = 4,
    filler_per_document: int = 4,
    document_tokens: tuple[int, int] | None = None,
) -> list[Case]:
    """`size` cases drawn from `seed` (same seed, same cases, on every machine).

    `documents` is a count or a (low, high) range drawn per case; `document_tokens` (a
    (low, high) range of word pieces) makes long documents of generated filler instead of
    `filler_per_document` fixed filler sentences. A range of documents needs
    `document_tokens` too (the short form keeps its exact old draws).
    """
    for name, value, least in (("size", size, 1), ("seed", seed, 0),
                               ("facts_per_document", facts_per_document, 1), ("filler_per_document", filler_per_document, 0)):
        if type(value) is not int or value < least:
            raise UsageError(f"{name}: expected a whole number >= {least}, got {value!r}")
    low, high = _span("documents", documents, 1)
    rng = random.Random(seed)
    if document_tokens is not None:
        tokens = _span("document_tokens", document_tokens, 1)
        if high * facts_per_document > len(ENTITIES) + len(MORE_ENTITIES):
            raise UsageError(
                f"documents x facts_per_document: at most {len(ENTITIES) + len(MORE_ENTITIES)} distinct entities exist; "
                "lower one of them"
            )
        needed = max(pieces(RELATIONS[r]["fact"].format(entity="Sequoia", value="Quentin Lindqvist")) for r in RELATIONS)
        if tokens[0] < facts_per_document * needed:
            raise UsageError(
                f"document_tokens: {tokens[0]} word pieces cannot hold {facts_per_document} facts; raise the range "
                "or lower facts_per_document"
            )
        return [
            draw_long_case(rng, i, documents=(low, high), facts_per_document=facts_per_document, tokens=tokens)
            for i in range(size)
        ]
    if low != high:
        raise UsageError("documents: a range of documents per case needs document_tokens too (long documents)")
    if filler_per_document > len(FILLER):
        raise UsageError(f"filler_per_document: at most {len(FILLER)} distinct filler sentences exist")
    if low * facts_per_document > len(ENTITIES):
        raise UsageError(
            f"documents x facts_per_document: at most {len(ENTITIES)} distinct entities exist; lower one of them"
        )
    return [
        draw_case(rng, i, documents=low, facts_per_document=facts_per_document, filler_per_document=filler_per_document)
        for i in range(size)
    ]


def write_dataset(path: str | os.PathLike[str], size: int, **options: Any) -> int:
    """Generate `size` cases and write them as JSONL (what `rclc-graph data make` does);
    `options` are `make_dataset`'s (seed, documents, facts_per_document, filler_per_document,
    document_tokens)."""
    return write_jsonl(path, make_dataset(size, **options))
