"""What `rclc-graph validate` checks, and what it imports: nothing, unless asked.

`validate` runs nothing, so it needs no `--trust-code` to say whether a topology is valid. A
topology that names code (`module:function` function nodes, routers, tools, selectors,
reasoning methods) is checked with those references as names: the result says which fields
name code, so the user knows `run` will need `--trust-code`, and nothing is imported.
`--check-imports` (with `--trust-code`, since an import runs the module's code) imports each
reference as `run` does before loading weights, from the topology alone, so the answer is
the same with or without `--input`. `--input` adds what only inputs show: the plan for those
inputs and each prompt against its model's context (tokenizers only; tool agents are counted
without their tools' descriptions unless imports are checked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ErrorCode, GraphError, PlanError, UsageError, format_path
from ..plan import plan_file, validate_file
from ..plan.dag import Plan
from ..plan.validate import Blueprint
from ..run.preflight import check_code, check_context
from ..spec import read_graph


@dataclass
class TopologyCheck:
    """What `validate` found: the blueprint, the plans for the inputs, and where the topology
    names code (fields that need --trust-code to run; empty when none or when trusted)."""

    blueprint: Blueprint
    plans: list[Plan] = field(default_factory=list)
    code_fields: list[str] = field(default_factory=list)
    imports_checked: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON `validate --json` prints for a valid topology."""
        return {"valid": True, "graph": self.blueprint.spec.name, "plans": [plan.describe() for plan in self.plans],
                "needs_trust_code": bool(self.code_fields), "code_fields": list(self.code_fields),
                "imports_checked": self.imports_checked}


def _code_fields(error: GraphError) -> list[str] | None:
    """The fields an E_TRUST_CODE refusal names, or None when the error has other problems too."""
    trust = [problem for problem in error.problems if problem.code == ErrorCode.E_TRUST_CODE]
    return [format_path(problem.path) for problem in trust] if trust else None


def checked_blueprint(topology: Path, trust_code: bool) -> tuple[Blueprint, list[str], bool]:
    """The validated topology; without trust_code, code references are checked as names (for
    `validate` and `draw`, which run nothing). Returns (blueprint, fields that name code,
    whether planning must treat code as trusted)."""
    try:
        return validate_file(topology, trust_code=trust_code), [], trust_code
    except PlanError as error:
        fields = _code_fields(error)
        if trust_code or fields is None:
            raise
    # Only the trust refusal stood in the way of that phase: check the rest with the names allowed
    # (profile files still obey the untrusted path rules).
    return validate_file(topology, trust_code=True, trusted_files=False), fields, True


def check_topology(
    topology: Path,
    runs: list[tuple[str, dict[str, Any]]],
    *,
    trust_code: bool,
    check_imports: bool,
    max_input_bytes: int,
    pool: Any,
    failing: Callable[[str], None] | None = None,
) -> TopologyCheck:
    """Every check `validate` makes (GraphError with file locations on problems); `failing(label)`
    is told which inputs a plan's problems belong to before they raise."""
    if check_imports and not trust_code:
        raise UsageError("--check-imports imports the code the topology names, which runs it; add --trust-code if "
                         "you trust that code")
    blueprint, code_fields, planning_trust = checked_blueprint(topology, trust_code)
    base_dir = topology.resolve().parent
    check = TopologyCheck(blueprint, code_fields=code_fields, imports_checked=check_imports)
    locate = read_graph(topology, trusted=trust_code).locate
    if check_imports:
        try:
            check_code(blueprint, base_dir)
        except GraphError as error:
            raise error.with_locations(locate) from None
    for label, inputs in runs:
        try:
            plan = plan_file(topology, inputs, trust_code=planning_trust, max_input_bytes=max_input_bytes,
                             trusted_files=trust_code)
            check_context(plan, pool, base_dir, imports=check_imports)
        except GraphError as error:
            if failing is not None:
                failing(label)
            raise error.with_locations(locate) from None
        check.plans.append(plan)
    return check


def trust_note(check: TopologyCheck) -> str | None:
    """One line for a topology that names code, or None."""
    if not check.code_fields:
        return None
    shown = ", ".join(check.code_fields[:4]) + (", ..." if len(check.code_fields) > 4 else "")
    return (f"it names code ({shown}): `run` needs --trust-code; nothing was imported "
            "(--check-imports --trust-code imports it now)")


def drawable_plan(topology: Path, inputs: dict[str, Any], trust_code: bool, max_input_bytes: int) -> Plan:
    """The plan `draw --input` draws: code references as names, nothing imported."""
    _, _, planning_trust = checked_blueprint(topology, trust_code)
    return plan_file(topology, inputs, trust_code=planning_trust, max_input_bytes=max_input_bytes,
                     trusted_files=trust_code)


__all__ = ["TopologyCheck", "check_topology", "checked_blueprint", "drawable_plan", "trust_note"]
