"""The words the task families draw from: organisation names and kinds, people, cities,
products, and neutral filler.

They are data, kept in `words.yaml` beside this module (shipped as package data) with the
relations' wordings, and read once. Large pools on purpose: a family whose names, values and
sentences repeat across cases would let a selector (or a person choosing defaults) learn the
pool instead of the task. Every value kind is disjoint from the others (no city is also a
surname, no product is a city), and no filler sentence holds a name, city, year, number or
product, so an answer string appears in a case only where a fact puts it.
"""

from __future__ import annotations

import functools
import random
from importlib import resources
from typing import Any

import yaml

WORDS_FILE = "words.yaml"


@functools.cache
def words() -> dict[str, Any]:
    """`words.yaml`, parsed once (through importlib.resources, so an installed package reads
    the copy its wheel shipped)."""
    text = resources.files(__package__).joinpath(WORDS_FILE).read_text(encoding="utf-8")
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def pool(*keys: str) -> tuple[Any, ...]:
    """The list at `keys` in `words.yaml` as a tuple (its nested lists as tuples too)."""
    found: Any = words()
    for key in keys:
        found = found[key]
    return tuple(tuple(item) if isinstance(item, list) else item for item in found)


ORG_NAMES: tuple[str, ...] = pool("org_names")
"""Organisation names (a case never uses one twice)."""
ORG_KINDS: tuple[str, ...] = pool("org_kinds")
"""What an organisation is; "the Cedar cooperative" names it in documents and questions."""
FIRST_NAMES: tuple[str, ...] = pool("first_names")
LAST_NAMES: tuple[str, ...] = pool("last_names")
CITIES: tuple[str, ...] = pool("cities")
PRODUCTS: tuple[tuple[str, str], ...] = pool("products")
"""(plural, singular): facts use the plural; an answer naming either is accepted."""
FILLER_SUBJECTS: tuple[str, ...] = pool("filler", "subjects")
FILLER_VERBS: tuple[str, ...] = pool("filler", "verbs")
FILLER_OBJECTS: tuple[str, ...] = pool("filler", "objects")
FILLER_TAILS: tuple[str, ...] = pool("filler", "tails")


def filler_sentence(rng: random.Random) -> str:
    """One neutral sentence composed from parts (no organisation, person, city, number or product)."""
    tail = rng.choice(FILLER_TAILS)
    return f"{rng.choice(FILLER_SUBJECTS)} {rng.choice(FILLER_VERBS)} {rng.choice(FILLER_OBJECTS)}{' ' + tail if tail else ''}."
