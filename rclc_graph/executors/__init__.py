"""Where nodes run: the scheduler hands each node to an executor, chosen per run, never by the topology.

- `local` (default): `LocalExecutor` (local.py), in this process, models from a `ModelPool`.
- `ray`: `rclc_graph.executors.ray.RayExecutor`, each model replica a Ray actor (docs/ray.md);
  needs the optional extra: pip install -e '.[ray]' from the checkout (the package is not on PyPI).

Every executor implements the contract in contract.py. `make_executor(name, ...)` builds one
by name (what `rclc-graph run --executor` and `run_plan(..., executor="ray")` use); Ray is
imported only when it is chosen. The names below are the package's public surface: the views
layer imports nothing else from here.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..errors import ExecutorUnavailable, UsageError
from .contract import DelegatingExecutor, Executor, Publish, RunContext
from .loaded_model import LoadedModel, ModelKey, model_key
from .local import LocalExecutor
from .placement import parse_pins, parse_replicas
from .pool import ModelPool, ModelProfile, default_pool

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install -e '.[ray]' in the rclc-graph checkout, or make ray (not on PyPI)"


def ray_available() -> bool:
    """Whether the optional Ray extra is installed (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def make_executor(
    name: str,
    *,
    pool: ModelPool | None = None,
    address: str | None = None,
    pins: dict[str, int] | None = None,
    replicas: dict[str, int] | None = None,
    **options: Any,
) -> Executor:
    """An executor by name: "local" (uses `pool`, default the process pool) or "ray" (connects
    to `address`, or starts a private local Ray instance when None; `pins` places nodes on
    replicas, `replicas` overrides models' replica counts; other keywords go to RayExecutor)."""
    if name == "local":
        if address is not None or pins or replicas:
            raise UsageError("address, pins, replicas: they apply to executor ray only; drop them or choose ray")
        return LocalExecutor(pool if pool is not None else default_pool())
    if name == "ray":
        if not ray_available():
            raise ExecutorUnavailable("executor 'ray' needs Ray, which is not installed here", RAY_INSTALL)
        from .ray import RayExecutor  # lazy: Ray is an optional extra

        return RayExecutor(address=address, pins=pins, replicas=replicas, **options)
    raise UsageError(f"executor: {name!r} is not one of {', '.join(EXECUTORS)}")


__all__ = [
    # the contract
    "DelegatingExecutor",
    "Executor",
    "Publish",
    "RunContext",
    # choosing an executor
    "EXECUTORS",
    "ExecutorUnavailable",
    "RAY_INSTALL",
    "make_executor",
    "parse_pins",
    "parse_replicas",
    "ray_available",
    # in this process
    "LoadedModel",
    "LocalExecutor",
    "ModelKey",
    "ModelPool",
    "ModelProfile",
    "default_pool",
    "model_key",
]
