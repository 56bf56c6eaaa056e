"""Which content words a question shares with a sentence: the paraphrase family's guarantee.

Words are case folded, common function words and question words dropped, and the rest cut
to a crude stem (a few irregular verbs mapped, then one suffix of -ership, -ation, -ion,
-ing, -ed, -es, -er, -s removed, a final -e dropped and -y read as -i), so "owns", "owned",
"owner" and "ownership" count as one word, and "study"/"studied" too. It is a heuristic for
English surface forms, strict on purpose: the paraphrase family keeps only question wordings
that share no stem with the evidence sentence besides the names in both.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Za-z]+")
STOPWORDS = frozenset(
    """a an the of in on at to for from by with and or but is are was were be been being has have had
    do does did it its it's this that which who whom whose what when where why how many much there their
    his her he she they them as into out up than since""".split()
)
_IRREGULAR = {"made": "make", "led": "lead", "ran": "run", "sold": "sell", "built": "build", "held": "hold",
              "began": "begin", "begun": "begin", "went": "go", "gone": "go", "born": "bear", "lies": "lie", "lay": "lie"}
_SUFFIXES = ("ership", "ation", "ion", "ing", "ed", "es", "er", "s")


def stem(word: str) -> str:
    """A crude stem (module docstring)."""
    word = _IRREGULAR.get(word.lower(), word.lower())
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    if word.endswith("y") and len(word) > 3:
        word = word[:-1] + "i"
    return word


def content_stems(text: str, *, ignore: str = "") -> set[str]:
    """The stems of `text`'s content words, leaving out those of `ignore` (e.g. the names a
    question and its evidence must share)."""
    ignored = {word.lower() for word in _WORD.findall(ignore)}
    return {stem(word) for word in _WORD.findall(text) if word.lower() not in STOPWORDS and word.lower() not in ignored}


def shared_stems(question: str, sentence: str, *, ignore: str = "") -> set[str]:
    """Content stems `question` and `sentence` share, names in `ignore` left out."""
    return content_stems(question, ignore=ignore) & content_stems(sentence, ignore=ignore)
