"""The one place the graph layer imports code a user named (`package.module:callable`).

Selectors, reasoning methods, function nodes, routers, tools and experiment scorers may be
given as references to code. An import runs that module's code, so it happens only when the
caller passed `trust_code`, and every refusal says which field named what and how to opt in.

A module next to a trusted topology file is importable without PYTHONPATH (issue 27): the
run registers the topology's directory (`search_beside`), and a finder placed after every
other one on `sys.meta_path` looks there for top-level modules Python did not find anywhere
else. It comes last, so a file beside the topology never hides an installed module or the
standard library, and it is registered only for plans with trust_code (nothing is searched
for a topology that was not trusted).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from ..errors import PlanError, UsageError


class _BesideTopologies(importlib.abc.MetaPathFinder):
    """Finds top-level modules in the directories of trusted topology files, last of all finders."""

    def __init__(self) -> None:
        self._directories: list[str] = []
        self._lock = threading.Lock()

    def add(self, directory: str) -> None:
        with self._lock:
            if directory not in self._directories:
                self._directories.append(directory)

    @property
    def directories(self) -> tuple[str, ...]:
        return tuple(self._directories)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or not self._directories:  # submodules are found through their package
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, list(self._directories))


_BESIDE = _BesideTopologies()
_INSTALL = threading.Lock()


def search_beside(directory: str | os.PathLike[str] | None) -> None:
    """Let `import_callable` (and the user's modules themselves) import top-level modules from
    `directory`, a trusted topology file's directory, when nothing else on sys.path has them.
    Call it only for a plan that has trust_code."""
    if directory is None:
        return
    _BESIDE.add(str(Path(directory).resolve()))
    with _INSTALL:
        if _BESIDE not in sys.meta_path:  # appended once: the import system reads the list while we run
            sys.meta_path.append(_BESIDE)
    importlib.invalidate_caches()


def searched_beside() -> tuple[str, ...]:
    """The topology directories registered so far (for error messages and tests)."""
    return _BESIDE.directories


def import_callable(reference: str, *, trust_code: bool, field_name: str) -> Callable[..., Any]:
    """The callable `reference` ("package.module:attribute.path") names.

    PlanError (E_TRUST_CODE) without `trust_code`; ValueError naming `field_name` when the
    module does not import, the attribute is missing or the target is not callable.
    """
    if not trust_code:
        raise PlanError.one(
            "E_TRUST_CODE",
            f"{field_name} {reference!r} imports code, and trust_code is off",
            "pass --trust-code / trust_code=True if you trust this code",
        )
    module_name, _, attribute = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(
            f"{field_name}: cannot import module {module_name!r} ({error}); a module must be on PYTHONPATH, installed, "
            "or next to the topology file"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{field_name}: module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise UsageError(f"{field_name}: {reference!r} is not callable")
    return target
