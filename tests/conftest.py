"""Shared fixtures: tiny random Qwen3 and Llama models built in-process, and the embedded model.

Unit tests run on both tiny families (parametrized `tiny`); integration tests use the
embedded SmolLM2-135M and are marked `integration`.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings

from rclc import models, testing

# Property and fuzz tests draw their examples from a fixed seed unless asked otherwise, so every
# CI run tries the same inputs and a red run means a change broke something, not that a new
# random draw found an old bug (issue 24: CI passes every time). Exploration with fresh draws:
# HYPOTHESIS_PROFILE=explore python -m pytest tests/unit/rclc_graph/spec/test_graph_fuzz.py
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# What the test runner's terminal says must not change what commands print: pytest-xdist gives
# its workers COLUMNS=80, which set the width of every table a CLI test reads (issue 24: tests
# may not depend on where they run). Removed before any test or subprocess starts.
for _variable in ("COLUMNS", "LINES"):
    os.environ.pop(_variable, None)

# Runs started with trust_code are sealed with a key in $XDG_CONFIG_HOME (run/record/trust_seal.py):
# tests keep theirs in a directory of their own, never in the home of whoever runs them.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="rclc-graph-tests-config-")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return testing.tiny_tokenizer()


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def tiny(request, tiny_tokenizer):
    """(model, tokenizer) for each tiny family; treat as read-only (shared by the session)."""
    return testing.tiny_model(request.param, tokenizer=tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_tokenizer):
    return testing.tiny_model("qwen3", tokenizer=tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama(tiny_tokenizer):
    return testing.tiny_model("llama", tokenizer=tiny_tokenizer)


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct (converted once into $RCLC_CACHE)."""
    return models.load("embedded")
