"""Executors by name: each registers what it is called, the options it owns and what it needs.

`make_executor(name, pool=..., **options)` is how the CLI (`rclc-graph run --executor`), the
server and `run_plan(executor="ray")` choose one. An option belongs to the executors that
declare it: passing it to another one is refused with the flag to drop (the CLI passes every
option the user gave, and learns here which executor takes it). An executor whose module
needs an optional extra (Ray) is imported only when chosen, so the registry holds where it
lives (`"module:attribute"`) rather than the class.

Adding an executor: its module (an `Executor` subclass with a `from_options(pool, **options)`
class method) and one `register(ExecutorKind(...))` line below.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ExecutorUnavailable, UsageError
from .contract import Executor
from .pool import ModelPool, default_pool

RAY_INSTALL = "pip install -e '.[ray]' in the rclc-graph checkout, or make ray (not on PyPI)"


@dataclass(frozen=True)
class ExecutorOption:
    """One option an executor takes: its `make_executor` keyword, the `rclc-graph run` flag that
    sets it (None: Python only), and how to get its effect with another executor (the fix)."""

    keyword: str
    flag: str | None = None
    elsewhere: str = ""

    @property
    def label(self) -> str:
        """The flag (with its keyword) as errors name it."""
        return self.keyword if self.flag is None else f"{self.flag} ({self.keyword})"


@dataclass(frozen=True)
class ExecutorKind:
    """A registered executor: `name` (`--executor NAME`), `target` ("module:Class", imported
    when chosen; the class makes itself with `from_options(pool, **options)`), its `options`,
    `available` (whether what it `needs` is installed) and `install` (how to install it)."""

    name: str
    target: str
    description: str
    options: tuple[ExecutorOption, ...] = ()
    available: Callable[[], bool] = field(default=lambda: True)
    needs: str = ""
    install: str = ""

    def option(self, keyword: str) -> ExecutorOption | None:
        """The option named `keyword`, if this executor takes it."""
        return next((option for option in self.options if option.keyword == keyword), None)


_KINDS: dict[str, ExecutorKind] = {}


def register(kind: ExecutorKind) -> ExecutorKind:
    """Make `kind` choosable by its name; a name registered twice is a mistake."""
    if kind.name in _KINDS:
        raise UsageError(f"executor: {kind.name!r} is registered already; choose another name")
    _KINDS[kind.name] = kind
    return kind


def executor_names() -> tuple[str, ...]:
    """The names `make_executor` accepts, in registration order (local first)."""
    return tuple(_KINDS)


def executor_kind(name: str) -> ExecutorKind:
    """The registered executor `name`, else UsageError listing the names there are."""
    kind = _KINDS.get(name)
    if kind is None:
        raise UsageError(f"executor: {name!r} is not one of {', '.join(_KINDS)}")
    return kind


def ray_available() -> bool:
    """Whether the optional Ray extra is installed (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def _given(options: dict[str, Any]) -> dict[str, Any]:
    """The options a caller set: None and an empty mapping or list mean "not given" (the CLI
    passes every flag, set or not)."""
    return {keyword: value for keyword, value in options.items() if value is not None and value != {} and value != ()}


def misplaced_options(name: str, options: dict[str, Any]) -> list[str]:
    """The options given that executor `name` does not take."""
    kind = executor_kind(name)
    return [keyword for keyword in _given(options) if kind.option(keyword) is None]


def check_options(name: str, options: dict[str, Any]) -> None:
    """UsageError naming every given option executor `name` does not take, with the executor
    that does and what to do instead."""
    misplaced = misplaced_options(name, options)
    if not misplaced:
        return
    owners = {keyword: [kind for kind in _KINDS.values() if kind.option(keyword) is not None] for keyword in misplaced}
    for keyword, kinds in owners.items():
        if not kinds:
            raise UsageError(f"{keyword}: no executor takes this option; drop it")
    owner = owners[misplaced[0]][0]
    taken = [option for option in owner.options if option.keyword in misplaced]
    labels = ", ".join(option.label for option in taken)
    fix = next((option.elsewhere for option in taken if option.elsewhere), "")
    verb = "it applies" if len(misplaced) == 1 else "they apply"
    raise UsageError(
        f"{labels}: {verb} to --executor {owner.name} only; "
        + (fix if fix else f"add --executor {owner.name} or drop {'it' if len(misplaced) == 1 else 'them'}")
    )


def make_executor(name: str, *, pool: ModelPool | None = None, **options: Any) -> Executor:
    """An executor by its registered name, with `options` it owns (see each kind's options):
    "local" uses `pool` (default: the process pool; `max_batch` caps its models' decode
    batches); "ray" connects to `address` (None: a private local Ray instance), places nodes
    by `pins`, overrides replica counts by `replicas`, and passes `init_options` to ray.init."""
    kind = executor_kind(name)
    check_options(name, options)
    if not kind.available():
        raise ExecutorUnavailable(f"executor {name!r} needs {kind.needs}, which is not installed here", kind.install)
    module, _, attribute = kind.target.partition(":")
    factory = getattr(importlib.import_module(module), attribute)
    return factory.from_options(pool if pool is not None else default_pool(), **_given(options))


register(ExecutorKind(
    "local", "rclc_graph.executors.local:LocalExecutor", "this process, models from a ModelPool",
    options=(ExecutorOption("max_batch", "--max-batch",
                            "set models[].batching.max_batch in the topology for replicas"),),
))
register(ExecutorKind(
    "ray", "rclc_graph.executors.ray:RayExecutor", "Ray actors, one per model replica; docs/ray.md",
    options=(ExecutorOption("address", "--address"), ExecutorOption("pins", "--pin"),
             ExecutorOption("replicas", "--replicas"), ExecutorOption("init_options")),
    available=lambda: ray_available(), needs="Ray", install=RAY_INSTALL,
))
