"""Fixtures of the Ray tests: the simulated two-machine cluster and a tiny model every actor can
load by path. Each module skips itself first without the optional extra (`make ray`);
test_ray_tool_agent.py starts its cluster with a runtime environment of its own."""

from __future__ import annotations

import pytest

from tests.helpers.ray_cluster import two_node_cluster
from tests.helpers.reliability import save_tiny


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each: two replicas with {CPU: 1} land on different nodes."""
    with two_node_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama saved to a directory, so every actor can load it by path."""
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama", max_positions=4096)
