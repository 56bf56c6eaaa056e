"""The simulated cluster of the Ray tests (tests/distributed/): two Ray nodes of one CPU each,
so two replicas asking for {CPU: 1} land on different nodes and handoffs cross machines.

Ray is imported when the cluster starts, not at import: the test modules skip themselves first
when the optional extra is missing (`pytest.importorskip("ray")`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def two_node_cluster(runtime_env: dict[str, Any] | None = None) -> Iterator[Any]:
    """A started two-node `ray.cluster_utils.Cluster` this process is connected to (with
    `runtime_env` for every worker when given); Ray shut down and the cluster gone after."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    options = {} if runtime_env is None else {"runtime_env": runtime_env}
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING", **options)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
