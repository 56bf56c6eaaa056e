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


KILL_LIMIT_SECONDS = 60.0  # bounds the wait for a killed actor's death, so CI fails rather than hangs


def kill_and_wait(actor: Any) -> None:
    """Kill `actor` and return once Ray reports it dead. `ray.kill` only asks for the kill: a
    call sent before it lands can still run to its end. A test that kills an actor while a
    node is on its way there waits here first, so the node fails on every machine, fast or
    slow, instead of racing a sleep against the node's own duration."""
    import time

    import ray
    from ray.exceptions import RayActorError

    ray.kill(actor)
    deadline = time.monotonic() + KILL_LIMIT_SECONDS
    while time.monotonic() < deadline:
        try:
            ray.get(actor.describe.remote(), timeout=KILL_LIMIT_SECONDS)
        except RayActorError:
            return
        time.sleep(0.01)
    raise TimeoutError(f"the killed actor still answered after {KILL_LIMIT_SECONDS:g} s")
