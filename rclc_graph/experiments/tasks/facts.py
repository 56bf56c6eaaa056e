"""Subjects, values and fact sentences: what every family builds its documents from.

A `Fact` is (subject, relation, value); `sentence` renders one fact, `joined` two facts of
one subject in one sentence. `Values` draws a case's values without repeats, so an answer
string occurs in a case only where its fact puts it (tests check this for every family).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .relations import ORG_RELATIONS, PERSON_RELATIONS, Relation
from .vocabulary import CITIES, FIRST_NAMES, LAST_NAMES, ORG_KINDS, ORG_NAMES, PRODUCTS


@dataclass(frozen=True)
class Subject:
    """An organisation ("the Cedar lab": `name` Cedar, `kind` lab) or a person (`kind` None)."""

    name: str
    kind: str | None = None

    @property
    def phrase(self) -> str:
        """How a sentence names it mid-sentence."""
        return self.name if self.kind is None else f"the {self.name} {self.kind}"

    @property
    def initial(self) -> str:
        """How a sentence names it at its start."""
        return self.name if self.kind is None else f"The {self.name} {self.kind}"


@dataclass(frozen=True)
class Fact:
    subject: Subject
    relation: Relation
    value: str


def relation(name: str) -> Relation:
    """An organisation or person relation by name."""
    return ORG_RELATIONS.get(name) or PERSON_RELATIONS[name]


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def fill(template: str, subject: Subject | str, value: str = "") -> str:
    """A template with its subject (or a phrase naming it) and value filled in (`{S}`/`{V}`
    capitalised)."""
    phrase, initial = (subject, _capital(subject)) if isinstance(subject, str) else (subject.phrase, subject.initial)
    return template.format(S=initial, s=phrase, v=value, V=_capital(value))


def sentence(fact: Fact, rng: random.Random, template: str | None = None) -> str:
    """One fact as a sentence, in a wording drawn from the relation's statements."""
    return fill(template or rng.choice(fact.relation.statements), fact.subject, fact.value)


def joined(first: Fact, second: Fact, rng: random.Random) -> str:
    """Two facts of one subject in one sentence ("X is based in Oslo and was founded in 1982",
    or "X, which is based in Oslo, was founded in 1982")."""
    if first.subject != second.subject:
        raise AssertionError("joined: both facts must share their subject")
    one = fill(rng.choice(first.relation.predicates), first.subject, first.value)
    two = fill(rng.choice(second.relation.predicates), second.subject, second.value)
    if rng.random() < 0.5:
        return f"{first.subject.initial} {one} and {two}."
    return f"{first.subject.initial}, which {one}, {two}."


def answers_for(kind: str, value: str) -> tuple[str, ...]:
    """The accepted answers for a value: products accept the singular too."""
    if kind == "product":
        singular = dict(PRODUCTS)[value]
        return (value, singular)
    return (value,)


class Values:
    """Draws a case's subjects and values, none of them twice (module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.first_names: set[str] = set()

    def _fresh(self, draw) -> str:
        for _ in range(10_000):
            value = draw()
            if value not in self.used:
                self.used.add(value)
                return value
        raise AssertionError("value pool exhausted")  # pools are far larger than any case needs

    def org(self) -> Subject:
        name = self._fresh(lambda: self.rng.choice(ORG_NAMES))
        return Subject(name, self.rng.choice(ORG_KINDS))

    def person(self) -> str:
        """A full name whose first name no other person of the case has (so "Alice" alone
        never points at two people)."""
        while True:
            first = self.rng.choice(FIRST_NAMES)
            if first not in self.first_names:
                break
        self.first_names.add(first)
        return self._fresh(lambda: f"{first} {self.rng.choice(LAST_NAMES)}")

    def value(self, kind: str) -> str:
        if kind == "person":
            return self.person()
        if kind == "city":
            return self._fresh(lambda: self.rng.choice(CITIES))
        if kind == "year":
            return self._fresh(lambda: str(self.rng.randint(1890, 2022)))
        if kind == "count":
            return self._fresh(lambda: str(self.rng.randint(12, 980)))
        if kind == "product":
            return self._fresh(lambda: self.rng.choice(PRODUCTS)[0])
        raise AssertionError(f"unknown value kind {kind!r}")
