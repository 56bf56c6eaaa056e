"""Loading a script of benchmarks/ as a module, for the tests of its pure pieces (benchmarks/
is not a package: its scripts run by path)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.paths import ROOT


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py, executed as a fresh module named `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
