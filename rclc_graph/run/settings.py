"""What the runs of one view share, built once and passed down: the model pool, the executor
that runs nodes, and the directory relative model paths resolve against.

A view (the CLI, the server, a stream, an experiment) builds one `RunSettings` and hands it to
`prepare_run`, `record_with`, `run_with` and the resume; the public functions (`run_plan`,
`run_recorded`, `resume_run`, `astream`) take the loose keywords people write and build it
once at the top. `trust_code` is not here: the plan carries it (`Plan.trust_code`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio

from ..executors import Executor, LocalExecutor, ModelPool, default_pool, make_executor
from ..executors.contract import require_executor
from ..plan.dag import Plan
from .preflight import check_code, check_context


@dataclass(frozen=True)
class RunSettings:
    """The pool models load into, the executor nodes run on, where relative model paths
    resolve (`base_dir`, the topology's directory), and whether the executor was made here
    (from a name, or the default local one) and is therefore closed by `close()`."""

    pool: ModelPool
    executor: Executor
    base_dir: Path | None = None
    owns_executor: bool = False

    @classmethod
    def build(
        cls,
        *,
        pool: ModelPool | None = None,
        executor: Executor | str | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> RunSettings:
        """Settings from what a caller passed: `pool` (default: the process pool), `executor`
        (an object, a registered name, or None for a local executor on `pool`). The local
        executor made here drops each state once no receiver still reads it (`keep_agents=False`,
        issue 28): nobody can ask it for an agent after the run."""
        pool = pool if pool is not None else default_pool()
        owned = not isinstance(executor, Executor)
        if isinstance(executor, str):
            executor = make_executor(executor, pool=pool)
        elif executor is None:
            executor = LocalExecutor(pool, keep_agents=False)
        return cls(pool, require_executor(executor), None if base_dir is None else Path(base_dir), owned)

    @property
    def loads_models_here(self) -> bool:
        """Whether this process loads the plan's models itself (a local executor made here):
        then a run prepares them before it starts (`prepare_run`)."""
        return self.owns_executor and isinstance(self.executor, LocalExecutor)

    def close(self) -> None:
        """Close the executor if it was made here; one the caller passed is the caller's."""
        if self.owns_executor:
            self.executor.close()


def preflight(plan: Plan, pool: ModelPool, base_dir: Path | None) -> None:
    """The checks every run passes before any weights load, with tokenizers alone: every
    trusted module:callable imports (modules beside the topology, in `base_dir`, too), and
    every prompt fits its model's context (preflight.py).
    Views call it where they can still point at the YAML line; `prepare_run` calls it too."""
    check_code(plan, base_dir)
    check_context(plan, pool, base_dir)


async def prepare_run(plan: Plan, settings: RunSettings) -> list[dict[str, str]]:
    """Preflight `plan`, then load its models (start the executor's replicas), so a run that
    cannot work fails before any weights are read and its timing shows the run, not the load.
    Returns where each replica runs ([] in this process)."""
    await anyio.to_thread.run_sync(preflight, plan, settings.pool, settings.base_dir)
    return await settings.executor.prepare(plan, settings.base_dir)
