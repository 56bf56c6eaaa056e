"""Where the tests find the repository: one constant, so a test moved into a deeper folder
reads the same files (docs, topologies, examples) without counting parent folders."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root (this file is tests/paths.py)
TESTS = ROOT / "tests"
HELPERS = TESTS / "helpers"
