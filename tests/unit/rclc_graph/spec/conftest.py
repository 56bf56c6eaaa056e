"""Fixtures of the bad-input tests (test_graph_bad_input.py, test_input_limits.py): a tiny model
on disk with a short context, so an overflow is cheap to write, and a guard that fails a test
whose refusal came only after model weights began to load."""

from __future__ import annotations

import pytest

from rclc_graph import ModelPool
from tests.helpers.reliability import save_tiny

CHECKPOINT_POSITIONS = 256  # the saved tiny model's context


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen3 on disk with a 256-position context."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", "qwen3", max_positions=CHECKPOINT_POSITIONS)


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to load a model's weights fails the test."""
    def refuse(self, spec, base_dir=None):
        raise AssertionError(f"model {spec.name!r} was loaded: the refusal came after model work began")

    monkeypatch.setattr(ModelPool, "get", refuse)
