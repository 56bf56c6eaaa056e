"""Where nodes run: the scheduler hands each node to an executor, chosen per run, never by the topology.

- `local` (default): `rclc_graph.runtime.LocalExecutor`, in this process.
- `ray`: `rclc_graph.executors.ray.RayExecutor`, each model replica a Ray actor (docs/ray.md);
  needs the optional extra: pip install 'rclc-graph[ray]'.

`make_executor(name, ...)` builds one by name (what `rclc-graph run --executor` and
`run_plan(..., executor="ray")` use); Ray is imported only when it is chosen.
"""

from __future__ import annotations

from typing import Any

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'rclc-graph[ray]'"


class ExecutorUnavailable(ImportError):
    """The chosen executor needs a package that is not installed (the message names the install)."""

    def __init__(self, reason: str, install: str) -> None:
        super().__init__(f"{reason}; install it with: {install}")
        self.reason, self.install = reason, install


def ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def make_executor(
    name: str,
    *,
    pool: Any = None,
    address: str | None = None,
    pins: dict[str, int] | None = None,
    replicas: dict[str, int] | None = None,
    **options: Any,
) -> Any:
    """An executor by name: "local" (uses `pool`, default the process pool) or "ray" (connects
    to `address`, or starts a private local Ray instance when None; `pins` places nodes on
    replicas, `replicas` overrides models' replica counts; other keywords go to RayExecutor)."""
    if name == "local":
        if address is not None or pins or replicas:
            raise ValueError("address, pins, replicas: they apply to executor ray only; drop them or choose ray")
        from ..pool import default_pool
        from ..runtime import LocalExecutor

        return LocalExecutor(pool if pool is not None else default_pool())
    if name == "ray":
        if not ray_available():
            raise ExecutorUnavailable("executor 'ray' needs Ray, which is not installed here", RAY_INSTALL)
        from .ray import RayExecutor

        return RayExecutor(address=address, pins=pins, replicas=replicas, **options)
    raise ValueError(f"executor: {name!r} is not one of {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "ExecutorUnavailable", "RAY_INSTALL", "make_executor", "ray_available"]
