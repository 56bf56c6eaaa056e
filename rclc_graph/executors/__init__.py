"""Where nodes run: the scheduler hands each node to an executor, chosen per run, never by the topology.

- `local` (default): `LocalExecutor` (local.py), in this process, models from a `ModelPool`.
- `ray`: `rclc_graph.executors.ray.RayExecutor`, each model replica a Ray actor (docs/ray.md);
  needs the optional extra: pip install -e '.[ray]' from the checkout (the package is not on PyPI).

Every executor implements the contract in contract.py and registers by name, with the
options it owns (registry.py); `make_executor(name, ...)` builds one by name (what
`rclc-graph run --executor` and `run_plan(..., executor="ray")` use); Ray is imported only
when it is chosen. The names below are the package's public surface: the views
layer imports nothing else from here.
"""

from __future__ import annotations

from ..errors import ExecutorUnavailable
from .contract import DelegatingExecutor, Executor, Publish, RunContext
from .loaded_model import LoadedModel, ModelKey, model_key
from .local import LocalExecutor
from .placement import parse_pins, parse_replicas
from .pool import ModelPool, ModelProfile, default_pool
from .registry import (
    RAY_INSTALL,
    ExecutorKind,
    ExecutorOption,
    check_options,
    executor_kind,
    executor_names,
    make_executor,
    ray_available,
    register,
)

__all__ = [
    # the contract
    "DelegatingExecutor",
    "Executor",
    "Publish",
    "RunContext",
    # choosing an executor
    "ExecutorKind",
    "ExecutorOption",
    "ExecutorUnavailable",
    "RAY_INSTALL",
    "check_options",
    "executor_kind",
    "executor_names",
    "make_executor",
    "register",
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
